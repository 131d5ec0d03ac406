# havip-agent: one static binary (glibc, -C target-feature=+crt-static) on scratch.
# Built by `make images` (hack/images.sh), which puts the binary in the context.
# Runs as root with only NET_ADMIN and NET_RAW (the chart drops every other
# capability): it adds VIPs by netlink and sends ARP/NA on raw sockets.
FROM scratch
LABEL org.opencontainers.image.title="havip-agent" \
      org.opencontainers.image.description="havip node agent: VIPs, announcements, heartbeats, probes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY havip-agent /havip-agent
ENTRYPOINT ["/havip-agent"]

# havip-operator: one static binary (glibc, -C target-feature=+crt-static) on scratch.
# Built by `make images` (hack/images.sh), which puts the binary in the context.
FROM scratch
LABEL org.opencontainers.image.title="havip-operator" \
      org.opencontainers.image.description="havip operator: reconciles HAPairs and FloatingIPs" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY havip-operator /havip-operator
# Non-root; the chart also sets runAsNonRoot and a read-only root filesystem.
USER 65532:65532
ENTRYPOINT ["/havip-operator"]

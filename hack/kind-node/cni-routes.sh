#!/bin/bash
# havip-kind-cni: the pod network of havip's kind node image (kind's own kindnetd is not
# available as a Go module). On its node it writes a CNI configuration (ptp + host-local
# with the node's spec.podCIDR, portmap) once the node has a podCIDR, and keeps one
# route per other node: that node's podCIDR via its InternalIP (all kind nodes share one
# L2 network, so no encapsulation is needed). It polls the node list every few seconds.
#
# Env: NODE_NAME (downward API), POD_SUBNET (the cluster's pod subnet), and
# CONTROL_PLANE_ENDPOINT (host:port, added by kind) so that it needs no kube-proxy.
set -uo pipefail
: "${NODE_NAME:?NODE_NAME is required}" "${POD_SUBNET:?POD_SUBNET is required}"
api="https://${CONTROL_PLANE_ENDPOINT:-${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT}}"
sa=/var/run/secrets/kubernetes.io/serviceaccount
conf_dir=/etc/cni/net.d
conf="$conf_dir/10-havip-kind.conflist"
interval="${POLL_SECONDS:-3}"

log() { printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

nodes() {
  curl -sSf --max-time 10 --cacert "$sa/ca.crt" -H "Authorization: Bearer $(cat "$sa/token")" "$api/api/v1/nodes"
}

write_conf() {
  local cidr="$1" tmp
  tmp=$(mktemp "$conf_dir/.havip-kind.XXXXXX")
  cat >"$tmp" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "havip-kind",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "dataDir": "/run/cni-ipam-state",
        "ranges": [[{"subnet": "$cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  chmod 0644 "$tmp"
  mv "$tmp" "$conf"
}

log "havip-kind-cni on $NODE_NAME: API $api, pod subnet $POD_SUBNET"
written=""
while true; do
  if list=$(nodes); then
    mine=$(jq -r --arg n "$NODE_NAME" '.items[] | select(.metadata.name == $n) | .spec.podCIDR // empty' <<<"$list")
    if [[ -n "$mine" && "$mine" != "$written" ]]; then
      write_conf "$mine"
      written="$mine"
      log "wrote $conf for podCIDR $mine"
    fi
    # Other nodes: "<podCIDR> <IPv4 InternalIP>".
    jq -r --arg n "$NODE_NAME" '.items[] | select(.metadata.name != $n and .spec.podCIDR != null)
        | "\(.spec.podCIDR) \([.status.addresses[]? | select(.type == "InternalIP" and (.address | contains(":") | not)) | .address][0] // "")"' <<<"$list" |
      while read -r cidr via; do
        [[ -z "$via" ]] && continue
        if [[ "$(ip -4 route show "$cidr")" != *"via $via "* ]]; then
          if ip route replace "$cidr" via "$via"; then log "route $cidr via $via"; else log "failed to add route $cidr via $via"; fi
        fi
      done
  else
    log "cannot list nodes from $api (retrying)"
  fi
  sleep "$interval"
done

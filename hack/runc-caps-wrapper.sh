#!/usr/bin/env bash
# An OCI runtime wrapper for machines whose capability bounding set lacks some
# capabilities (for example a VM without CAP_SYS_RESOURCE): Docker asks for every
# capability it knows for a `--privileged` container, runc cannot grant one outside its
# own bounding set, and the container fails with "unable to apply caps: operation not
# permitted". This wrapper removes from the OCI spec of `create`/`run` (the bundle's
# config.json) and of `exec` (the --process file) every capability outside its own
# bounding set, then runs the real runc with the same arguments. On a machine with the
# full set it changes nothing. hack/dockerd.sh registers it with
# `dockerd --add-runtime havip-runc=… --default-runtime=havip-runc` only when needed.
#
# The real runc: $HAVIP_RUNC, else the first `runc` on PATH.
set -euo pipefail
real="${HAVIP_RUNC:-$(command -v runc)}"

# Capability names by number (linux/capability.h); the kernel knows up to cap_last_cap.
names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
  LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
  SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
  SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
  MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
  CHECKPOINT_RESTORE)
bnd=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
missing=()
for i in "${!names[@]}"; do
  if (( (bnd >> i & 1) == 0 )); then missing+=("CAP_${names[$i]}"); fi
done

filter() {
  # filter <json file> <jq path of the capabilities object>
  local f="$1" path="$2" drop
  drop=$(printf '%s\n' "${missing[@]}" | jq -R . | jq -s -c .)
  jq --argjson drop "$drop" \
    "if $path == null then . else $path |= with_entries(.value |= (if type == \"array\" then map(select(. as \$c | \$drop | index(\$c) | not)) else . end)) end" \
    "$f" >"$f.havip-tmp" && mv "$f.havip-tmp" "$f"
}

if ((${#missing[@]})); then
  cmd="" bundle="." process=""
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    a="${args[$i]}"
    case "$a" in
      --bundle | -b) bundle="${args[$((i + 1))]}" ;;
      --bundle=*) bundle="${a#--bundle=}" ;;
      --process | -p) process="${args[$((i + 1))]}" ;;
      --process=*) process="${a#--process=}" ;;
      create | run | exec) [[ -z "$cmd" ]] && cmd="$a" ;;
    esac
  done
  case "$cmd" in
    create | run) [[ -f "$bundle/config.json" ]] && filter "$bundle/config.json" .process.capabilities ;;
    exec) [[ -n "$process" && -f "$process" ]] && filter "$process" .capabilities ;;
  esac
fi
exec "$real" "$@"

import re, sys
# Converts `nft --debug=mnl` output into one line per netlink message:
# "<type> <family> <hex of the attributes after the nfgenmsg>".
text = re.sub(r'\x1b\[[0-9;]*m', '', sys.stdin.read())
msgs = []
cur = None
state = None
for line in text.splitlines():
    m = re.match(r'\|\s+(\d+)\s+\|\s+\| message length', line)
    if m:
        cur = {'len': int(m.group(1)), 'attrs': bytearray()}
        msgs.append(cur); continue
    m = re.match(r'\|\s+(\d+)\s+\|\s+(\S+)\s+\|\s+\|\s+type \| flags', line)
    if m and cur is not None:
        cur['type'] = int(m.group(1)); continue
    m = re.match(r'\| ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2})\s+\|\s+\|\s+extra header', line)
    if m and cur is not None:
        cur['fam'] = int(m.group(1), 16); continue
    m = re.match(r'\|(\d+)\|([N-])([B-])\|(\d+)\|', line)
    if m and cur is not None:
        ln = int(m.group(1)); t = int(m.group(4))
        if m.group(2) == 'N': t |= 0x8000
        if m.group(3) == 'B': t |= 0x4000
        cur['attrs'] += ln.to_bytes(2, 'little') + t.to_bytes(2, 'little'); continue
    m = re.match(r'\| ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2})\s+\|\s+\|\s+data', line)
    if m and cur is not None:
        cur['attrs'] += bytes(int(m.group(i), 16) for i in range(1, 5)); continue
for m in msgs:
    print(m.get('type'), m.get('fam'), m['attrs'].hex())

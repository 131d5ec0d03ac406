//! nftables rules for a drain, through nf_tables netlink, behind a small typed API.
//!
//! A drain moves a VIP on purpose while the old holder still runs, and keeps the TCP
//! connections established on the old holder alive. Two rule sets do that, each in
//! tables of its own per pair, so that pairs never collide and a set goes away by
//! deleting its tables:
//!
//! - the **forwarder**, on the *new* holder ([`Nft::set_forwarder`]): a TCP segment to
//!   the VIP that is not a plain SYN and that this host's conntrack does not know
//!   belongs to a connection of the old holder; `nf_dup` sends a copy to the old
//!   holder's node address on the VIP's link — a known next hop, so the copy keeps
//!   the VIP as destination IP and gets the old holder's MAC — and the original is
//!   dropped. A plain SYN, a new connection, is served here. Tables
//!   `ip havip-<pair>-fwd` and `ip6 havip-<pair>-fwd` (`dup` exists in the `ip` and
//!   `ip6` families only, not in `inet`), chain `prerouting` at priority -150: after
//!   conntrack (-200), before DNAT (-100), so kube-proxy never sees these packets.
//! - the **quieter**, on the *old* holder ([`Nft::set_quieter`]): it keeps the VIP as a
//!   local address, so its sockets keep working, but must not attract traffic for it:
//!   it does not answer ARP requests / neighbour solicitations for the VIP, and when
//!   it resolves a client itself it asks from its own node address instead of the VIP
//!   (which the kernel would otherwise use as sender, and which would point the
//!   client's entry for the VIP back at it). Tables `arp havip-<pair>-quiet` and
//!   `ip6 havip-<pair>-quiet`, chains `input` and `output`.
//! - the **guard**, on every member, from its agent's start to its stop
//!   ([`Nft::set_guard`]): a packet addressed to one of the pair's VIPs that arrives on
//!   the VIP's link while the VIP is no local address here is dropped, never routed back
//!   out of that link. Tables `ip havip-<pair>-guard` and `ip6 havip-<pair>-guard`, chain
//!   `prerouting` at priority 0 (after DNAT, see [`expr::guard_rule`]).
//!
//! **Loops.** With forwarding on — every Kubernetes node — a member without the VIP
//! routes what it receives for it to the VIP's holder. During a drain that is the new
//! holder, whose forwarder copies the same segment back, and so on until the TTL runs
//! out (issue 25 counted 465 copies at a drain's end, 8,959 when the old holder's agent
//! stopped mid-drain). Three things keep it from happening, each enough alone: the guard
//! on the old holder drops such a copy; the forwarder gives every copy TTL 1, so that no
//! node can route it on, and matches only segments that arrive on the VIP's link (see
//! [`expr::forward_rule`]); and a stopping agent tells its peer at once (a last heartbeat
//! that no longer says it drains), so the forwarder goes without waiting for a
//! heartbeat timeout. The guard is also the rule a member that does not hold a VIP
//! follows whatever sends it the VIP's traffic: it drops it rather than routing it back.
//! It stays when the agent is killed (the next start replaces it before the start-up
//! removes a drain's addresses from `lo`), and goes when the agent stops, leaves the
//! pair or is uninstalled.
//!
//! Every change is one nf_tables batch (all or nothing); every message of it is
//! acknowledged and every answer is read back, so an error names the operation and
//! the errno. Reads and writes are bounded by a timeout: a socket that never answers
//! cannot hang the caller. The API is synchronous; the runtime calls it from
//! `spawn_blocking`.
//!
//! Kernel requirements: nf_tables with the `arp`, `ip` and `ip6` families, and the
//! `ct`, `dup` (nf_dup_ipv4/ipv6), `fib` (nft_fib_ipv4/ipv6), `payload`, `cmp`,
//! `bitwise`, `meta`, `counter` and `immediate` expressions. A `ct` expression enables conntrack in the network
//! namespace when the rule is added (nf_tables takes a reference on it), so nothing
//! has to load or enable it beforehand.
//!
//! Table names: `havip-<pair>-fwd`, `havip-<pair>-quiet` and `havip-<pair>-guard`. nf_tables allows 255
//! bytes; a DNS-1123 pair name has up to 253. A pair name longer than 243 bytes (the
//! most `havip-…-quiet` fits) is shortened to its first 226 bytes, `_` and 16 hex
//! digits of its 64-bit FNV-1a hash: stable across versions and machines, and never
//! equal to a plain name (`_` is not allowed in pair names).
//!
//! Size: the typed API, naming and errors here; the wire format in `msg`, the rule
//! programs in `expr`, the socket in `sock`.
//!
//! Why not a crate: `nftnl` binds the C libnftnl (no static build on `scratch`, and
//! unsafe FFI in an agent that forbids `unsafe`), `nftables` drives the `nft` binary
//! (not in the image), and `rustables` is GPL-3.0; a few hundred lines of netlink
//! messages, checked byte for byte against nft 1.0.6 (`tests.rs`), cost less.

mod error;
mod expr;
mod msg;
mod sock;

pub use error::{Family, NftError, Op, TableRef};
pub use expr::Counter;

use expr::{NFPROTO_ARP, NFPROTO_BRIDGE, NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, NFPROTO_NETDEV, NFPROTO_UNSPEC};
use msg::{NLM_F_APPEND, NLM_F_CREATE};
use nix::errno::Errno;
use sock::{Batch, Conn};
use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// How long one request may wait for the kernel's answers.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Every havip table name starts with this.
pub const TABLE_PREFIX: &str = "havip-";
const FWD_SUFFIX: &str = "-fwd";
const QUIET_SUFFIX: &str = "-quiet";
const GUARD_SUFFIX: &str = "-guard";
/// `NFT_NAME_MAXLEN` is 256 with the NUL.
const MAX_NAME: usize = 255;
/// The longest pair name used as it is: `havip-<pair>-quiet` (and `-guard`, as long)
/// must fit.
const MAX_PLAIN_PAIR: usize = MAX_NAME - TABLE_PREFIX.len() - QUIET_SUFFIX.len();
/// How much of a longer pair name is kept before `_<hash>`.
const KEPT_PAIR: usize = MAX_PLAIN_PAIR - 1 - 16;
/// A DNS-1123 subdomain's maximum length.
const MAX_PAIR: usize = 253;

/// One VIP the forwarder sends to its old holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ForwardRule {
    /// The VIP (IPv4 or IPv6).
    pub vip: IpAddr,
    /// The old holder's node address on the VIP's link, of the VIP's family: the next
    /// hop the copies are sent to (its MAC, not its IP, ends up in the frame).
    pub old_holder: IpAddr,
    /// The interface index of the VIP's link on this node: the copies go out of it.
    pub ifindex: u32,
    /// The interface the VIP's packets arrive on: the link itself, or the pair's virtual
    /// MAC interface on it (see `announce::l2::vmac`).
    pub iif: u32,
}

impl fmt::Display for ForwardRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "forward {} to {} via ifindex {}", self.vip, self.old_holder, self.ifindex)?;
        if self.iif != self.ifindex {
            write!(f, " (arriving on ifindex {})", self.iif)?;
        }
        Ok(())
    }
}

/// One VIP the guard protects from being routed back out of its link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GuardRule {
    /// The VIP (IPv4 or IPv6).
    pub vip: IpAddr,
    /// The interface index of the VIP's link on this node.
    pub ifindex: u32,
}

impl fmt::Display for GuardRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "guard {} on ifindex {}", self.vip, self.ifindex)
    }
}

/// One VIP the quieter keeps quiet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuietRule {
    /// The VIP (IPv4 or IPv6).
    pub vip: IpAddr,
    /// This node's own address on the VIP's link, of the VIP's family: the sender of
    /// its ARP requests / neighbour solicitations instead of the VIP.
    pub own: IpAddr,
}

impl fmt::Display for QuietRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "quiet {} (ask from {})", self.vip, self.own)
    }
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Self::Ip => NFPROTO_IPV4,
            Self::Ip6 => NFPROTO_IPV6,
            Self::Arp => NFPROTO_ARP,
            Self::Inet => NFPROTO_INET,
            Self::Bridge => NFPROTO_BRIDGE,
            Self::Netdev => NFPROTO_NETDEV,
            Self::Other(n) => n,
        }
    }

    fn from_nfproto(n: u8) -> Self {
        match n {
            NFPROTO_IPV4 => Self::Ip,
            NFPROTO_IPV6 => Self::Ip6,
            NFPROTO_ARP => Self::Arp,
            NFPROTO_INET => Self::Inet,
            NFPROTO_BRIDGE => Self::Bridge,
            NFPROTO_NETDEV => Self::Netdev,
            n => Self::Other(n),
        }
    }

    /// The family of `addr`'s IP tables.
    fn of(addr: IpAddr) -> Self {
        if addr.is_ipv4() { Self::Ip } else { Self::Ip6 }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip => f.write_str("ip"),
            Self::Ip6 => f.write_str("ip6"),
            Self::Arp => f.write_str("arp"),
            Self::Inet => f.write_str("inet"),
            Self::Bridge => f.write_str("bridge"),
            Self::Netdev => f.write_str("netdev"),
            Self::Other(n) => write!(f, "family {n}"),
        }
    }
}

/// Which rule set a havip table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableKind {
    /// `havip-<pair>-fwd`.
    Forwarder,
    /// `havip-<pair>-quiet`.
    Quieter,
    /// `havip-<pair>-guard`.
    Guard,
}

impl TableKind {
    fn suffix(self) -> &'static str {
        match self {
            Self::Forwarder => FWD_SUFFIX,
            Self::Quieter => QUIET_SUFFIX,
            Self::Guard => GUARD_SUFFIX,
        }
    }

    /// The families this kind's tables live in.
    fn families(self) -> [Family; 2] {
        match self {
            Self::Forwarder => [Family::Ip, Family::Ip6],
            Self::Quieter => [Family::Arp, Family::Ip6],
            Self::Guard => [Family::Ip, Family::Ip6],
        }
    }

    /// Every kind.
    pub const ALL: [TableKind; 3] = [TableKind::Forwarder, TableKind::Quieter, TableKind::Guard];
}

impl TableRef {
    /// Every table `pair` can have, whether or not it exists.
    pub fn of_pair(pair: &str) -> Result<Vec<TableRef>, NftError> {
        Self::of_pair_kinds(pair, &TableKind::ALL)
    }

    /// The tables of `kinds` that `pair` can have.
    pub fn of_pair_kinds(pair: &str, kinds: &[TableKind]) -> Result<Vec<TableRef>, NftError> {
        let mut out = Vec::new();
        for &kind in kinds {
            let name = table_name(pair, kind)?;
            out.extend(kind.families().map(|family| TableRef { family, name: name.clone() }));
        }
        Ok(out)
    }

    /// Which kind of havip table this is, by its name; `None` if it is not havip's.
    pub fn kind(&self) -> Option<TableKind> {
        let rest = self.name.strip_prefix(TABLE_PREFIX)?;
        TableKind::ALL.into_iter().find(|k| rest.strip_suffix(k.suffix()).is_some_and(|pair| !pair.is_empty()))
    }
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// Checks that `pair` is a DNS-1123 subdomain (lower-case alphanumerics, `-` and `.`,
/// starting and ending alphanumeric, at most 253 bytes): pairs are Kubernetes object
/// names, and the check keeps NULs and the `_` of shortened names out of table names.
fn check_pair(pair: &str) -> Result<(), NftError> {
    let invalid = |reason: &str| Err(NftError::InvalidPair { pair: pair.to_owned(), reason: reason.to_owned() });
    if pair.is_empty() || pair.len() > MAX_PAIR {
        return invalid("a pair name has 1 to 253 characters");
    }
    if !pair.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.') {
        return invalid("a pair name has only lower-case letters, digits, '-' and '.'");
    }
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !alnum(pair.bytes().next()) || !alnum(pair.bytes().last()) {
        return invalid("a pair name starts and ends with a letter or digit");
    }
    Ok(())
}

/// 64-bit FNV-1a: tiny, and unlike `std`'s hasher stable across Rust versions.
fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The name of `pair`'s tables of `kind` (see the module docs).
pub fn table_name(pair: &str, kind: TableKind) -> Result<String, NftError> {
    check_pair(pair)?;
    let suffix = kind.suffix();
    if pair.len() <= MAX_PLAIN_PAIR {
        return Ok(format!("{TABLE_PREFIX}{pair}{suffix}"));
    }
    // ASCII was checked, so any byte index is a character boundary.
    let kept = pair.get(..KEPT_PAIR).unwrap_or(pair);
    Ok(format!("{TABLE_PREFIX}{kept}_{:016x}{suffix}", fnv1a64(pair)))
}

/// A handle on nf_tables in the current network namespace: one `NETLINK_NETFILTER`
/// socket. Not shared between threads; each call is one request and its answers.
#[derive(Debug)]
pub struct Nft {
    conn: Conn,
}

impl Nft {
    /// Opens the socket, with [`DEFAULT_TIMEOUT`] per request.
    pub fn open() -> Result<Nft, NftError> {
        Self::with_timeout(DEFAULT_TIMEOUT)
    }

    /// Opens the socket; a request whose answers do not all arrive within `timeout`
    /// fails with [`NftError::Timeout`].
    pub fn with_timeout(timeout: Duration) -> Result<Nft, NftError> {
        Ok(Nft { conn: Conn::open(timeout)? })
    }

    /// Replaces the pair's forwarder tables with exactly `rules`, in one atomic batch
    /// (an empty list removes them). Counters restart from zero.
    ///
    /// Three rules per VIP (see [`expr::forward_unowned_rule`], [`expr::forward_rule`],
    /// [`expr::forward_close_rule`]). A kernel without the nft `socket` expression
    /// (`CONFIG_NFT_SOCKET`) refuses the first: the batch is sent again without it, with
    /// a warning (a client that reuses a port this host served within two minutes may
    /// then get a reset during a drain).
    pub fn set_forwarder(&mut self, pair: &str, rules: &[ForwardRule]) -> Result<(), NftError> {
        match self.set_forwarder_with(pair, rules, true) {
            Err(NftError::Kernel { errno, .. })
                if !rules.is_empty() && matches!(errno, Errno::ENOENT | Errno::EOPNOTSUPP) =>
            {
                tracing::warn!(
                    pair, %errno,
                    "nft: the kernel has no socket expression (CONFIG_NFT_SOCKET): the drain forwards by conntrack alone"
                );
                self.set_forwarder_with(pair, rules, false)
            }
            other => other,
        }
    }

    fn set_forwarder_with(&mut self, pair: &str, rules: &[ForwardRule], by_socket: bool) -> Result<(), NftError> {
        let name = table_name(pair, TableKind::Forwarder)?;
        let invalid = |reason: String| NftError::InvalidRule { pair: pair.to_owned(), kind: "forwarder", reason };
        let mut seen = HashSet::new();
        for r in rules {
            if r.vip.is_ipv4() != r.old_holder.is_ipv4() {
                return Err(invalid(format!("{r}: the VIP and the old holder's address are of different families")));
            }
            if [r.ifindex, r.iif].iter().any(|i| *i == 0 || i32::try_from(*i).is_err()) {
                return Err(invalid(format!("{r}: not an interface index")));
            }
            if !seen.insert(r.vip) {
                return Err(invalid(format!("{} twice", r.vip)));
            }
        }
        let mut batch = Batch::new(self.conn.next_seq());
        for family in TableKind::Forwarder.families() {
            let table = TableRef { family, name: name.clone() };
            let mine: Vec<&ForwardRule> = rules.iter().filter(|r| Family::of(r.vip) == family).collect();
            replace_table(&mut batch, &table, !mine.is_empty());
            if mine.is_empty() {
                continue;
            }
            add_chain(&mut batch, &table, expr::FWD_PREROUTING);
            type Build = fn(&mut msg::Writer, &str, IpAddr, IpAddr, u32, u32);
            let all: [Build; 3] = [expr::forward_unowned_rule, expr::forward_rule, expr::forward_close_rule];
            let builds = if by_socket { &all[..] } else { &all[1..] };
            for r in mine {
                for build in builds {
                    let op =
                        Op::AddRule { table: table.clone(), chain: expr::FWD_PREROUTING.name, rule: r.to_string() };
                    batch.push(op, expr::NFT_MSG_NEWRULE, family.nfproto(), NLM_F_CREATE | NLM_F_APPEND, |w| {
                        build(w, &table.name, r.vip, r.old_holder, r.iif, r.ifindex)
                    });
                }
            }
        }
        tracing::debug!(pair, rules = rules.len(), messages = batch.len(), "nft: setting the forwarder");
        self.apply(batch)
    }

    /// Replaces the pair's quieter tables with exactly `rules`, in one atomic batch (an
    /// empty list removes them).
    pub fn set_quieter(&mut self, pair: &str, rules: &[QuietRule]) -> Result<(), NftError> {
        let name = table_name(pair, TableKind::Quieter)?;
        let invalid = |reason: String| NftError::InvalidRule { pair: pair.to_owned(), kind: "quieter", reason };
        let mut seen = HashSet::new();
        for r in rules {
            if r.vip.is_ipv4() != r.own.is_ipv4() {
                return Err(invalid(format!("{r}: the VIP and the own address are of different families")));
            }
            if !seen.insert(r.vip) {
                return Err(invalid(format!("{} twice", r.vip)));
            }
        }
        let mut batch = Batch::new(self.conn.next_seq());
        for family in TableKind::Quieter.families() {
            let table = TableRef { family, name: name.clone() };
            // IPv4 VIPs are quieted in the ARP family, IPv6 ones in ip6 (NDP is ICMPv6).
            let v4 = family == Family::Arp;
            let mine: Vec<&QuietRule> = rules.iter().filter(|r| r.vip.is_ipv4() == v4).collect();
            replace_table(&mut batch, &table, !mine.is_empty());
            if mine.is_empty() {
                continue;
            }
            let (input, output) = if v4 {
                (expr::QUIET_ARP_INPUT, expr::QUIET_ARP_OUTPUT)
            } else {
                (expr::QUIET_IP6_INPUT, expr::QUIET_IP6_OUTPUT)
            };
            add_chain(&mut batch, &table, input);
            add_chain(&mut batch, &table, output);
            for r in mine {
                let op = Op::AddRule { table: table.clone(), chain: input.name, rule: r.to_string() };
                batch.push(op, expr::NFT_MSG_NEWRULE, family.nfproto(), NLM_F_CREATE | NLM_F_APPEND, |w| {
                    expr::quiet_input_rule(w, &table.name, r.vip)
                });
                let op = Op::AddRule { table: table.clone(), chain: output.name, rule: r.to_string() };
                batch.push(op, expr::NFT_MSG_NEWRULE, family.nfproto(), NLM_F_CREATE | NLM_F_APPEND, |w| {
                    expr::quiet_output_rule(w, &table.name, r.vip, r.own)
                });
            }
        }
        tracing::debug!(pair, rules = rules.len(), messages = batch.len(), "nft: setting the quieter");
        self.apply(batch)
    }

    /// Replaces the pair's guard tables with exactly `rules`, in one atomic batch (an
    /// empty list removes them): see [`expr::guard_rule`].
    pub fn set_guard(&mut self, pair: &str, rules: &[GuardRule]) -> Result<(), NftError> {
        let name = table_name(pair, TableKind::Guard)?;
        let invalid = |reason: String| NftError::InvalidRule { pair: pair.to_owned(), kind: "guard", reason };
        let mut seen = HashSet::new();
        for r in rules {
            if r.ifindex == 0 || i32::try_from(r.ifindex).is_err() {
                return Err(invalid(format!("{r}: not an interface index")));
            }
            if !seen.insert(r.vip) {
                return Err(invalid(format!("{} twice", r.vip)));
            }
        }
        let mut batch = Batch::new(self.conn.next_seq());
        for family in TableKind::Guard.families() {
            let table = TableRef { family, name: name.clone() };
            let mine: Vec<&GuardRule> = rules.iter().filter(|r| Family::of(r.vip) == family).collect();
            replace_table(&mut batch, &table, !mine.is_empty());
            if mine.is_empty() {
                continue;
            }
            add_chain(&mut batch, &table, expr::GUARD_PREROUTING);
            for r in mine {
                let op = Op::AddRule { table: table.clone(), chain: expr::GUARD_PREROUTING.name, rule: r.to_string() };
                batch.push(op, expr::NFT_MSG_NEWRULE, family.nfproto(), NLM_F_CREATE | NLM_F_APPEND, |w| {
                    expr::guard_rule(w, &table.name, r.vip, r.ifindex)
                });
            }
        }
        tracing::debug!(pair, rules = rules.len(), messages = batch.len(), "nft: setting the guard");
        self.apply(batch)
    }

    /// Packets and bytes the pair's forwarder sent to the old holder so far, per VIP
    /// (read back from the rules' counters; empty when there is no forwarder).
    pub fn forwarded(&mut self, pair: &str) -> Result<Vec<(IpAddr, Counter)>, NftError> {
        let name = table_name(pair, TableKind::Forwarder)?;
        let mut out: Vec<(IpAddr, Counter)> = Vec::new();
        for family in TableKind::Forwarder.families() {
            let table = TableRef { family, name: name.clone() };
            let op = Op::ListRules(table.clone());
            let mut rules = Vec::new();
            self.conn.dump(
                &op,
                expr::NFT_MSG_GETRULE,
                family.nfproto(),
                |w| expr::rule_dump_attrs(w, &name),
                |fam, body| {
                    rules.push(expr::parse_forward_rule(fam, body)?);
                    Ok(())
                },
            )?;
            for r in rules {
                // Older kernels ignore the table filter of a rule dump; keep ours only.
                if r.table != name || r.family != family.nfproto() {
                    continue;
                }
                if r.chain != expr::FWD_PREROUTING.name {
                    let reason = format!("a rule in chain {} of a forwarder table", r.chain);
                    return Err(NftError::Malformed { op, reason });
                }
                // Several rules per VIP (see `set_forwarder`): one entry, their sum.
                match out.iter_mut().find(|(v, _)| *v == r.vip) {
                    Some((_, c)) => {
                        c.packets = c.packets.saturating_add(r.counter.packets);
                        c.bytes = c.bytes.saturating_add(r.counter.bytes);
                    }
                    None => out.push((r.vip, r.counter)),
                }
            }
        }
        Ok(out)
    }

    /// Every havip table present, by name (`havip-…-fwd`, `-quiet`, `-guard`) in any
    /// family: for the start-up cleanup of pairs no longer configured (see
    /// [`Nft::remove_leftovers`]).
    pub fn havip_tables(&mut self) -> Result<Vec<TableRef>, NftError> {
        let mut out = Vec::new();
        self.conn.dump(
            &Op::ListTables,
            expr::NFT_MSG_GETTABLE,
            NFPROTO_UNSPEC,
            |_| {},
            |family, body| {
                let t = TableRef { family: Family::from_nfproto(family), name: expr::parse_table_name(body)? };
                if t.kind().is_some() {
                    out.push(t);
                }
                Ok(())
            },
        )?;
        out.sort();
        Ok(out)
    }

    /// Deletes the pair's drain tables (forwarder and quieter) and keeps its guard: for a
    /// start, which replaces the guard itself (so that there is no moment without one).
    pub fn remove_drain(&mut self, pair: &str) -> Result<(), NftError> {
        let tables = TableRef::of_pair_kinds(pair, &[TableKind::Forwarder, TableKind::Quieter])?;
        self.remove_tables(&tables)
    }

    /// Deletes every table of the pair; a table that is not there is success, so this
    /// is idempotent. Each table goes in its own batch: every one is tried, and the
    /// errors of those that could not be deleted are returned together.
    pub fn remove_pair(&mut self, pair: &str) -> Result<(), NftError> {
        let tables = TableRef::of_pair(pair)?;
        self.remove_tables(&tables)
    }

    /// Deletes `tables` (missing ones are success), each in its own batch; tries every
    /// one and returns the errors together.
    pub fn remove_tables(&mut self, tables: &[TableRef]) -> Result<(), NftError> {
        let mut errors = Vec::new();
        for t in tables {
            let mut batch = Batch::new(self.conn.next_seq());
            batch.push(Op::DeleteTable(t.clone()), expr::NFT_MSG_DELTABLE, t.family.nfproto(), 0, |w| {
                expr::table_name_attr(w, &t.name)
            });
            match self.apply(batch) {
                Ok(()) => tracing::debug!(table = %t, "nft: table deleted"),
                // ENOENT: there was no such table (nf_tables_deltable's only ENOENT).
                Err(NftError::Kernel { op: Op::DeleteTable(_), errno: Errno::ENOENT, .. }) => {}
                Err(e) => {
                    tracing::warn!(table = %t, error = %e, "nft: failed to delete a table, going on with the others");
                    errors.push(e);
                }
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(NftError::Remove { errors }),
        }
    }

    /// Deletes every havip table that belongs to none of the pairs in `keep`, and
    /// returns them. Invalid names in `keep` are errors (nothing is deleted then).
    pub fn remove_leftovers(&mut self, keep: &[&str]) -> Result<Vec<TableRef>, NftError> {
        let mut kept = HashSet::new();
        for pair in keep {
            kept.extend(TableRef::of_pair(pair)?);
        }
        let leftovers: Vec<TableRef> = self.havip_tables()?.into_iter().filter(|t| !kept.contains(t)).collect();
        self.remove_tables(&leftovers)?;
        Ok(leftovers)
    }

    /// Sends one batch; the first error in batch order is returned, the others logged.
    fn apply(&mut self, batch: Batch) -> Result<(), NftError> {
        let mut errors = self.conn.transact(batch)?.into_iter();
        let Some(first) = errors.next() else { return Ok(()) };
        for other in errors {
            tracing::debug!(error = %other, "nft: a further error in the same batch");
        }
        Err(first)
    }
}

/// Appends "this table is now empty or gone" to `batch`: add it (a no-op if it exists),
/// delete it (so the delete never fails on a missing table — the usual nft idiom, which
/// works on every kernel, unlike `NFT_MSG_DESTROYTABLE` from 6.3), and when `recreate`
/// add it again.
fn replace_table(batch: &mut Batch, table: &TableRef, recreate: bool) {
    let family = table.family.nfproto();
    batch.push(Op::AddTable(table.clone()), expr::NFT_MSG_NEWTABLE, family, NLM_F_CREATE, |w| {
        expr::table_attrs(w, &table.name)
    });
    batch.push(Op::DeleteTable(table.clone()), expr::NFT_MSG_DELTABLE, family, 0, |w| {
        expr::table_name_attr(w, &table.name)
    });
    if recreate {
        batch.push(Op::AddTable(table.clone()), expr::NFT_MSG_NEWTABLE, family, NLM_F_CREATE, |w| {
            expr::table_attrs(w, &table.name)
        });
    }
}

fn add_chain(batch: &mut Batch, table: &TableRef, chain: expr::ChainSpec) {
    let op = Op::AddChain { table: table.clone(), chain: chain.name };
    batch.push(op, expr::NFT_MSG_NEWCHAIN, table.family.nfproto(), NLM_F_CREATE, |w| {
        expr::chain_attrs(w, &table.name, chain)
    });
}

#[cfg(test)]
mod tests;

//! Errors of nftables operations ([`NftError`]) and what they name: the operation
//! ([`Op`]), the table ([`TableRef`]) and its family ([`Family`]). A leaf module: the
//! socket (`super::sock`) and the typed API ([`super`]) build on it; the tables' naming
//! and the families' numbers are [`super`]'s.

use nix::errno::Errno;
use std::fmt;
use std::time::Duration;

/// An nftables address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// `ip` (IPv4).
    Ip,
    /// `ip6`.
    Ip6,
    /// `arp`.
    Arp,
    /// `inet` (IPv4 and IPv6).
    Inet,
    /// `bridge`.
    Bridge,
    /// `netdev`.
    Netdev,
    /// A family number this code does not know.
    Other(u8),
}

/// A table, by family and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableRef {
    /// Its family.
    pub family: Family,
    /// Its name.
    pub name: String,
}

/// An operation on nf_tables, as errors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Adding a table.
    AddTable(TableRef),
    /// Deleting a table.
    DeleteTable(TableRef),
    /// Adding a base chain to a table.
    AddChain {
        /// The table.
        table: TableRef,
        /// The chain.
        chain: &'static str,
    },
    /// Adding a rule.
    AddRule {
        /// The table.
        table: TableRef,
        /// The chain.
        chain: &'static str,
        /// What the rule does.
        rule: String,
    },
    /// The batch as a whole: sending it, or its commit.
    Batch,
    /// Listing tables.
    ListTables,
    /// Listing a table's rules.
    ListRules(TableRef),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AddTable(t) => write!(f, "add table {t}"),
            Self::DeleteTable(t) => write!(f, "delete table {t}"),
            Self::AddChain { table, chain } => write!(f, "add chain {table} {chain}"),
            Self::AddRule { table, chain, rule } => write!(f, "add rule {table} {chain} ({rule})"),
            Self::Batch => f.write_str("apply an nf_tables batch"),
            Self::ListTables => f.write_str("list nftables tables"),
            Self::ListRules(t) => write!(f, "list the rules of table {t}"),
        }
    }
}

/// Errors of nftables operations. Every message starts with "failed to" and names the
/// operation.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The `NETLINK_NETFILTER` socket could not be opened.
    #[error("failed to open a NETLINK_NETFILTER socket: {0}")]
    Open(#[source] std::io::Error),
    /// The pair name cannot name tables.
    #[error("failed to name the nftables tables of pair {pair:?}: {reason}")]
    InvalidPair {
        /// The pair name.
        pair: String,
        /// Why.
        reason: String,
    },
    /// A rule cannot be built (mixed families, a duplicate VIP, ifindex 0).
    #[error("failed to build the {kind} rules of pair {pair}: {reason}")]
    InvalidRule {
        /// The pair.
        pair: String,
        /// `forwarder`, `quieter` or `guard`.
        kind: &'static str,
        /// Why.
        reason: String,
    },
    /// Sending a request failed.
    #[error("failed to send the request to {op}: {source}")]
    Send {
        /// The operation.
        op: Op,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Receiving the answers failed. For a batch this leaves its outcome unknown (with
    /// ENOBUFS, answers were lost); `set_*` replace everything, so calling again is safe.
    #[error("failed to receive the kernel's answer to {op}: {source}")]
    Receive {
        /// The operation.
        op: Op,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kernel did not answer in time.
    #[error("failed to {op}: no answer from the kernel within {timeout:?}")]
    Timeout {
        /// The first operation still unanswered.
        op: Op,
        /// The timeout.
        timeout: Duration,
    },
    /// The kernel refused an operation.
    #[error("failed to {op}: {errno}{}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default(), hint(op, *errno))]
    Kernel {
        /// The operation.
        op: Op,
        /// The kernel's errno.
        errno: Errno,
        /// The kernel's extended-ack message, if any.
        message: Option<String>,
    },
    /// An answer could not be parsed, or a havip table holds something havip does not
    /// write.
    #[error("failed to {op}: unexpected answer from the kernel: {reason}")]
    Malformed {
        /// The operation.
        op: Op,
        /// What was wrong.
        reason: String,
    },
    /// A dump kept being interrupted by concurrent ruleset changes.
    #[error("failed to {op}: the ruleset changed during each of {tries} dumps")]
    DumpInterrupted {
        /// The operation.
        op: Op,
        /// How many dumps were tried.
        tries: usize,
    },
    /// Several tables could not be removed; every one was tried.
    #[error("failed to remove {} nftables table(s): {}", errors.len(), errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Remove {
        /// One error per table that could not be removed.
        errors: Vec<NftError>,
    },
}

impl NftError {
    pub(super) fn kernel(op: Op, errno: i32, message: Option<String>) -> Self {
        Self::Kernel { op, errno: Errno::from_raw(errno), message }
    }

    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Open(_) => "open",
            Self::InvalidPair { .. } | Self::InvalidRule { .. } => "invalid",
            Self::Send { .. } | Self::Receive { .. } => "io",
            Self::Timeout { .. } => "timeout",
            Self::Kernel { errno: Errno::EPERM, .. } => "permission",
            Self::Kernel { .. } => "kernel",
            Self::Malformed { .. } | Self::DumpInterrupted { .. } => "dump",
            Self::Remove { .. } => "remove",
        }
    }

    /// The errno, when the kernel refused something.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// A hint for the errnos whose cause is not obvious from `op` and the errno alone.
fn hint(op: &Op, errno: Errno) -> &'static str {
    match (op, errno) {
        (_, Errno::EPERM) => "; nftables needs CAP_NET_ADMIN in the node's network namespace",
        // nf_tables answers ENOENT for an expression type it cannot find (after trying
        // to load its module) and EOPNOTSUPP for one the family or hook does not allow.
        (Op::AddRule { .. }, Errno::ENOENT) => {
            "; the kernel lacks an expression of this rule (nft_ct, nft_dup_ipv4/ipv6, nft_fib_ipv4/ipv6 or nf_conntrack?)"
        }
        (Op::AddRule { .. }, Errno::EOPNOTSUPP) => "; the kernel does not support an expression of this rule here",
        (Op::AddTable(_), Errno::EAFNOSUPPORT) => "; the kernel lacks nf_tables support for this family",
        (_, Errno::EMSGSIZE | Errno::ENOBUFS) => "; the batch is too large for the netlink socket",
        _ => "",
    }
}

//! The chaos run (`make chaos`): random, overlapping faults from the whole catalogue on
//! the Kubernetes lab while clients probe every VIP, judged only from what the clients
//! and the segment saw (Jepsen's method). See docs/chaos.md.
//!
//! - [`schedule`]: the nemesis's faults, drawn from a seed (pure);
//! - [`checker`]: the verdict from the clients' probes, the ARP answers, the Leases and
//!   the status (pure);
//! - [`arp`]: the observer of who answers ARP for each VIP;
//! - [`lab`]: the lab and the nemesis's hands (inject, heal, leftovers);
//! - [`run`]: one run, start to verdict.

pub mod arp;
pub mod checker;
pub mod lab;
pub mod run;
pub mod schedule;

//! Test traffic: TCP [`Listener`]s that answer with their node's name, a client
//! [`Prober`] that connects to a VIP every few milliseconds and records who answered
//! and when nobody did, [`LongLived`] connections that exchange a message every 50 ms
//! and record when they break, and [`HalfOpen`] connections held in the middle of their
//! handshake (the client sent its SYN and got the SYN-ACK; the server has not seen the
//! ACK yet) to be completed after a move.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use havip_e2e::netns::Topology;
//! use havip_e2e::traffic::{Listener, Prober};
//! use std::net::SocketAddr;
//! let topo = Topology::builder().nodes(2).build()?;
//! let _l0 = Listener::on_node(&topo, 0, 8080)?;
//! let _l1 = Listener::on_node(&topo, 1, 8080)?;
//! let prober = Prober::on_client(&topo, SocketAddr::from((topo.vip(0), 8080)))?;
//! // … move the VIP …
//! let report = prober.stop()?;
//! println!("{}", report.summary());
//! # Ok(()) }
//! ```
//!
//! Both run on threads that joined the namespace with
//! [`crate::host::netns::run_in_netns`]; no process is started.
//!
//! | module | what |
//! |---|---|
//! | [`listener`] | [`Listener`]s (name, HTTP, echo) and [`respond`] |
//! | [`prober`] | the [`Prober`], [`probe_once`], [`probe_stream`] |
//! | [`report`] | [`Probe`]s and the [`ProbeReport`] computed from them |
//! | [`long_lived`] | [`LongLived`] connections and their [`LongLivedReport`] |
//! | [`half_open`] | [`HalfOpen`] connections |
//! | [`lines`] | the line protocol of echo listeners |
//! | [`error`] | [`TrafficError`] |
//! | [`loops`] | counters of packets that loop between members during a drain |

pub mod error;
pub mod half_open;
pub mod lines;
pub mod listener;
pub mod long_lived;
pub mod loops;
pub mod prober;
pub mod report;

pub use error::TrafficError;
pub use half_open::{Completed, HalfOpen, HalfOpenFailure};
pub use listener::{Listener, respond};
pub use long_lived::{Break, BreakKind, ConnReport, LongLived, LongLivedConfig, LongLivedReport};
pub use prober::{Prober, ProberConfig, probe_once, probe_stream};
pub use report::{Failure, Gap, Probe, ProbeError, ProbeReport, Run};

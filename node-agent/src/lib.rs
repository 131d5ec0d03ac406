//! havip node agent library: the pure HA state machine ([`sm`]) and its deterministic
//! simulator ([`sim`]).
#![warn(missing_docs)]

pub mod sim;
pub mod sm;

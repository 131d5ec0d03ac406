//! What the benchmark binaries (`src/bin/bench-*.rs`) share beyond the harness: the cost
//! of a daemon at idle read from `/proc` ([`footprint`]).

pub mod footprint;

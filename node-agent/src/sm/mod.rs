//! state machine

//! The havip operator library (controllers arrive with the operator issue).

pub mod sm;

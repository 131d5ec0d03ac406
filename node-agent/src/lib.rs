pub mod sm;
pub mod netlink;

pub mod announce;
pub mod netlink;
pub mod sm;

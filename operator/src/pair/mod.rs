//! The HAPair controller's reconciles, as [`crate::loadbalancer`] holds the Service and
//! VIPPool ones: the pair reconcile ([`hapair`]: observe → [`crate::model::plan`], pure →
//! apply), the key Secret it creates and rotates ([`keysecret`]), what it writes onto
//! other objects (the `InvalidSpec` condition, the operator's part of a FloatingIP's
//! status, member labels: [`status`]) and the FloatingIP reconcile ([`floatingip`]:
//! `PairFound`, and the rest while the pair is missing). The decisions are the model's
//! ([`crate::model`]); the watches that trigger these are wired in [`crate::controller`].

pub mod floatingip;
pub mod hapair;
pub mod keysecret;
pub mod status;

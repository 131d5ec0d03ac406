//! Test harness for the state-machine rule tests: one machine driven by scripted inputs,
//! plus helpers to build adverts and inspect actions.
#![allow(dead_code)]

use std::collections::BTreeSet;

use havip_sm::*;

pub const A: &str = "node-a";
pub const B: &str = "node-b";
pub const C: &str = "node-c";
pub const VIP: &str = "vip-1";
pub const VIP2: &str = "vip-2";

pub fn node(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

pub fn vip(s: &str) -> VipId {
    VipId::new(s).unwrap()
}

/// A pair config with two heartbeat paths and one VIP probed on port 80.
pub fn config(local: &str, members: &[(&str, u8)]) -> Config {
    let mut c = Config::new(node(local), members.iter().map(|(n, p)| Member { node: node(n), priority: *p }).collect());
    c.paths = vec![PathId(0), PathId(1)];
    c.vips = vec![VipSpec { id: vip(VIP), probe_ports: vec![80], health_ports: vec![] }];
    c
}

/// The usual two members: A (priority 200, preferred) and B (100).
pub fn pair(local: &str) -> Config {
    config(local, &[(A, 200), (B, 100)])
}

/// An advert as a healthy member would send it.
pub fn adv(sender: &str, prio: u8, role: Role, epoch: u64, holds: bool) -> Advert {
    Advert {
        sender: node(sender),
        role,
        epoch,
        priority: prio,
        holds_vips: holds,
        config_revision: 0,
        protocol_major: PROTOCOL.major,
        protocol_minor: PROTOCOL.minor,
        ready_all: true,
        maintenance: false,
        carrier_ok: true,
        gateway: Some(true),
        suspended: false,
        failback_paused: false,
        draining: false,
        op: None,
        // An agent of an earlier release (no member is quiet towards it): the rules'
        // tests see the heartbeat-interval pacing; the quiet standby's tests declare one.
        interval_ms: 0,
    }
}

pub fn active(sender: &str, prio: u8, epoch: u64) -> Advert {
    adv(sender, prio, Role::Active, epoch, true)
}

pub fn standby(sender: &str, prio: u8, epoch: u64) -> Advert {
    adv(sender, prio, Role::Standby, epoch, false)
}

pub fn with_op(mut a: Advert, id: u64, kind: OpKind) -> Advert {
    a.op = Some(OpMsg { id, kind });
    a
}

/// One machine and a clock.
pub struct H {
    pub m: Machine,
    pub now: u64,
    pub log: Vec<(u64, Action)>,
}

impl H {
    pub fn new(cfg: Config, p: Persisted) -> H {
        H { m: Machine::new(cfg, p), now: 0, log: Vec::new() }
    }

    pub fn feed(&mut self, input: Input) -> Vec<Action> {
        let a = self.m.step(Millis(self.now), input);
        for x in &a {
            self.log.push((self.now, x.clone()));
        }
        a
    }

    /// Links up, gateway reachable, no VIPs on the interface, listeners up, no Lease.
    pub fn env_ok(&mut self) -> Vec<Action> {
        let mut out = self.env_links();
        out.extend(self.local_vips(&[]));
        out
    }

    /// Like `env_ok` but without the first `LocalVips` observation (which decides whether
    /// a restarted agent adopts the VIPs).
    pub fn env_links(&mut self) -> Vec<Action> {
        let mut out = self.env_links_standalone();
        out.extend(self.feed(Input::LeaseObserved { holder: None, epoch: 0 }));
        out
    }

    /// Like `env_links` without any Lease observation (standalone mode: no Lease store).
    pub fn env_links_standalone(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        out.extend(self.feed(Input::Carrier { link: Link::Data, up: true }));
        out.extend(self.feed(Input::Carrier { link: Link::Vip, up: true }));
        out.extend(self.feed(Input::Gateway { reachable: Some(true) }));
        out.extend(self.listeners(true));
        out
    }

    pub fn local_vips(&mut self, vips: &[&str]) -> Vec<Action> {
        let present: BTreeSet<VipId> = vips.iter().map(|v| vip(v)).collect();
        self.feed(Input::LocalVips { present })
    }

    pub fn listeners(&mut self, up: bool) -> Vec<Action> {
        let mut out = Vec::new();
        for v in self.m.config().vips.clone() {
            for p in v.listener_ports() {
                out.extend(self.feed(Input::LocalProbe { vip: v.id.clone(), port: p, up }));
            }
        }
        out
    }

    pub fn lease(&mut self, holder: Option<&str>, epoch: u64) -> Vec<Action> {
        self.feed(Input::LeaseObserved { holder: holder.map(node), epoch })
    }

    pub fn carrier(&mut self, up: bool) -> Vec<Action> {
        self.feed(Input::Carrier { link: Link::Data, up })
    }

    pub fn gateway(&mut self, g: Option<bool>) -> Vec<Action> {
        self.feed(Input::Gateway { reachable: g })
    }

    pub fn cmd(&mut self, c: Command) -> Vec<Action> {
        self.feed(Input::Command(c))
    }

    pub fn cas(&mut self, r: CasResult) -> Vec<Action> {
        self.feed(Input::CasResult(r))
    }

    /// The advert on both paths.
    pub fn hear(&mut self, a: &Advert) -> Vec<Action> {
        let mut out = self.feed(Input::Advert { path: PathId(0), msg: a.clone() });
        out.extend(self.feed(Input::Advert { path: PathId(1), msg: a.clone() }));
        out
    }

    /// The advert on one path only.
    pub fn hear_on(&mut self, path: u8, a: &Advert) -> Vec<Action> {
        self.feed(Input::Advert { path: PathId(path), msg: a.clone() })
    }

    pub fn probe(&mut self, up: bool) -> Vec<Action> {
        let mut out = Vec::new();
        for v in self.m.config().vips.clone() {
            if v.probe_ports.is_empty() {
                continue;
            }
            out.extend(
                self.feed(Input::PeerProbe { vip: v.id, result: if up { ProbeResult::Up } else { ProbeResult::Down } }),
            );
        }
        out
    }

    /// Advances to `until` in 20 ms ticks; every 100 ms each of `peers` is heard on both
    /// paths; every 50 ms the data-plane probe reports `probe` (if given).
    pub fn run(&mut self, until: u64, peers: &[Advert], probe: Option<bool>) -> Vec<Action> {
        let mut out = Vec::new();
        while self.now < until {
            self.now = (self.now + 10).min(until);
            if self.now.is_multiple_of(100) {
                for p in peers {
                    out.extend(self.hear(p));
                }
            }
            if self.now.is_multiple_of(50)
                && let Some(up) = probe
            {
                out.extend(self.probe(up));
            }
            if self.now.is_multiple_of(20) {
                out.extend(self.feed(Input::Tick));
            }
        }
        out
    }

    pub fn status(&self) -> Status {
        self.m.status()
    }

    pub fn role(&self) -> Role {
        self.m.role()
    }

    /// Actions logged since time `t`.
    pub fn since(&self, t: u64) -> Vec<Action> {
        self.log.iter().filter(|(at, _)| *at >= t).map(|(_, a)| a.clone()).collect()
    }

    /// Time of the first logged action matching `f`.
    pub fn first_at(&self, f: impl Fn(&Action) -> bool) -> Option<u64> {
        self.log.iter().find(|(_, a)| f(a)).map(|(t, _)| *t)
    }
}

/// Booted standby B of the usual pair that has heard A active (epoch 1) for 2 s with the
/// data plane answering; the Lease names A under epoch 1. Time is 2000.
pub fn standby_b_hearing_a() -> H {
    let mut h = H::new(pair(B), Persisted::default());
    h.env_ok();
    h.lease(Some(A), 1);
    h.run(2_000, &[active(A, 200, 1)], Some(true));
    assert_eq!(h.role(), Role::Standby);
    h
}

/// Active A of the usual pair (epoch `e`, holding the VIP), hearing standby B ready on both
/// paths for 2 s. Time is 3000.
pub fn active_a_with_b(e: u64) -> H {
    let mut h = H::new(pair(A), Persisted { epoch: e, last_role: Role::Active, ..Persisted::default() });
    h.env_links();
    h.local_vips(&[VIP]);
    h.lease(Some(A), e);
    h.run(3_000, &[standby(B, 100, e)], None);
    assert_eq!(h.role(), Role::Active);
    assert!(h.m.holds_vips());
    h
}

pub fn adds(a: &[Action]) -> Vec<Vec<VipId>> {
    a.iter()
        .filter_map(|x| match x {
            Action::AddVips(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

/// The drains started: (VIPs, new holder).
pub fn drains(a: &[Action]) -> Vec<(Vec<VipId>, NodeId)> {
    a.iter()
        .filter_map(|x| match x {
            Action::DrainVips { vips, to } => Some((vips.clone(), to.clone())),
            _ => None,
        })
        .collect()
}

pub fn removes(a: &[Action]) -> Vec<Vec<VipId>> {
    a.iter()
        .filter_map(|x| match x {
            Action::RemoveVips(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

pub fn cas_of(a: &[Action]) -> Vec<(u64, u64)> {
    a.iter()
        .filter_map(|x| match x {
            Action::CasLease { new_epoch, expected_epoch, .. } => Some((*new_epoch, *expected_epoch)),
            _ => None,
        })
        .collect()
}

pub fn adverts(a: &[Action]) -> Vec<Advert> {
    a.iter()
        .filter_map(|x| match x {
            Action::SendAdvert(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

pub fn last_advert(a: &[Action]) -> Advert {
    adverts(a).pop().expect("an advert")
}

pub fn ops(a: &[Action]) -> Vec<OpMsg> {
    adverts(a).into_iter().filter_map(|x| x.op).collect()
}

pub fn role_changes(a: &[Action]) -> Vec<(Role, Role, Reason, u64)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Report(Event::RoleChanged { from, to, reason, epoch }) => Some((*from, *to, *reason, *epoch)),
            _ => None,
        })
        .collect()
}

pub fn results(a: &[Action]) -> Vec<(u64, bool, String)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Report(Event::OperationResult { id, ok, message }) => Some((*id, *ok, message.clone())),
            _ => None,
        })
        .collect()
}

pub fn raised(a: &[Action]) -> Vec<Alarm> {
    a.iter()
        .filter_map(|x| match x {
            Action::Report(Event::AlarmRaised { alarm, .. }) => Some(*alarm),
            _ => None,
        })
        .collect()
}

pub fn cleared(a: &[Action]) -> Vec<Alarm> {
    a.iter()
        .filter_map(|x| match x {
            Action::Report(Event::AlarmCleared { alarm }) => Some(*alarm),
            _ => None,
        })
        .collect()
}

pub fn persisted(a: &[Action]) -> Vec<Persisted> {
    a.iter()
        .filter_map(|x| match x {
            Action::Persist(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

pub fn announces(a: &[Action]) -> Vec<AnnounceKind> {
    a.iter()
        .filter_map(|x| match x {
            Action::Announce { kind } => Some(*kind),
            _ => None,
        })
        .collect()
}

pub fn position(a: &[Action], f: impl Fn(&Action) -> bool) -> Option<usize> {
    a.iter().position(f)
}

pub fn first_prepare(a: &[Action]) -> Option<(u64, NodeId)> {
    ops(a).into_iter().find_map(|o| match o.kind {
        OpKind::Prepare { to } => Some((o.id, to)),
        _ => None,
    })
}

pub fn last_commit(a: &[Action]) -> Option<(u64, NodeId, u64)> {
    ops(a).into_iter().rev().find_map(|o| match o.kind {
        OpKind::Commit { to, epoch } => Some((o.id, to, epoch)),
        _ => None,
    })
}

/// Drives an automatic handover of `h` (active A, epoch 3) to B through ack and confirm;
/// returns the actions of the confirm step.
pub fn complete_handover(h: &mut H, id: u64) -> Vec<Action> {
    h.now += 5;
    let out = h.hear_on(1, &with_op(standby(B, 100, 3), id, OpKind::PrepareAck));
    assert_eq!(last_commit(&out), Some((id, node(B), 4)));
    assert_eq!(h.role(), Role::Demoting);
    assert!(removes(&out).is_empty(), "make-before-break: still holding");
    h.now += 5;
    h.hear_on(1, &with_op(active(B, 100, 4), id, OpKind::Confirm))
}

//! Routes and policy rules that follow the holder (the HAPair's `routes` and `rules`):
//! added with protocol [`HAVIP_ADDR_PROTO`] (0x68), so that a removal never takes a route
//! or rule that is not havip's, whatever its destination, table or priority.

use super::{EEXIST, ENOENT, ESRCH, HAVIP_ADDR_PROTO, Netlink, NetlinkError, errno};
use havip_crds::{HolderRoute, HolderRule};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{RouteMessage, RouteProtocol, RouteScope};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::RouteMessageBuilder;

/// What an add found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    /// It was not there and is now.
    New,
    /// It was there already (`EEXIST`: havip's from before, or one of the same kernel key
    /// that is not havip's, which is left as it is).
    Present,
}

fn route_error<'a>(op: &'static str, r: &'a HolderRoute) -> impl Fn(rtnetlink::Error) -> NetlinkError + 'a {
    move |source| NetlinkError::HolderRoute { op, what: format!("route {r}"), source }
}

fn rule_error<'a>(op: &'static str, r: &'a HolderRule) -> impl Fn(rtnetlink::Error) -> NetlinkError + 'a {
    move |source| NetlinkError::HolderRoute { op, what: format!("rule {r}"), source }
}

impl Netlink {
    /// The route message of `r`; `delete`: the one that removes it — its destination,
    /// table, metric, gateway and protocol, any scope and interface (one that is gone
    /// took its routes with it, and the route is still found without it).
    async fn holder_route_message(&self, r: &HolderRoute, delete: bool) -> Result<RouteMessage, NetlinkError> {
        let bad = |e: String| NetlinkError::BadRoute { addr: r.destination.addr, reason: e };
        let mut b = RouteMessageBuilder::<std::net::IpAddr>::new()
            .destination_prefix(r.destination.addr, r.destination.len)
            .map_err(|e| bad(e.to_string()))?;
        if let Some(g) = r.gateway {
            b = b.gateway(g).map_err(|e| bad(e.to_string()))?;
        }
        if let (Some(s), false) = (r.source, delete) {
            b = b.pref_source(s).map_err(|e| bad(e.to_string()))?;
        }
        let mut b = b.table_id(r.table).protocol(RouteProtocol::Other(HAVIP_ADDR_PROTO)).priority(r.metric);
        if delete {
            b = b.scope(RouteScope::NoWhere);
        } else {
            if let Some(name) = &r.interface {
                b = b.output_interface(self.link(name).await?.index);
            }
            // As `ip route` does: a route without a gateway reaches its destination on
            // the link.
            if r.gateway.is_none() && r.destination.addr.is_ipv4() {
                b = b.scope(RouteScope::Link);
            }
        }
        Ok(b.build())
    }

    /// Adds `r`. One of the same kernel key (destination, table, metric) already there is
    /// [`Added::Present`], not replaced.
    pub async fn add_holder_route(&self, r: &HolderRoute) -> Result<Added, NetlinkError> {
        let msg = self.holder_route_message(r, false).await?;
        match self.handle().route().add(msg).execute().await {
            Ok(()) => Ok(Added::New),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(Added::Present),
            Err(e) => Err(route_error("add", r)(e)),
        }
    }

    /// Removes `r` if it is havip's (protocol 0x68); gone is success.
    pub async fn remove_holder_route(&self, r: &HolderRoute) -> Result<(), NetlinkError> {
        let msg = self.holder_route_message(r, true).await?;
        self.delete_route(msg).await.map_err(route_error("remove", r))
    }

    fn holder_rule_message(r: &HolderRule) -> RuleMessage {
        let mut m = RuleMessage::default();
        m.header.family = if r.v6 { AddressFamily::Inet6 } else { AddressFamily::Inet };
        m.header.action = RuleAction::ToTable;
        match u8::try_from(r.table) {
            Ok(t) => m.header.table = t,
            Err(_) => m.attributes.push(RuleAttribute::Table(r.table)),
        }
        if let Some(p) = r.from {
            m.header.src_len = p.len;
            m.attributes.push(RuleAttribute::Source(p.addr));
        }
        if let Some(p) = r.to {
            m.header.dst_len = p.len;
            m.attributes.push(RuleAttribute::Destination(p.addr));
        }
        m.attributes.push(RuleAttribute::Priority(r.priority));
        m.attributes.push(RuleAttribute::Protocol(RouteProtocol::Other(HAVIP_ADDR_PROTO)));
        m
    }

    /// Adds `r`. An identical rule already there is [`Added::Present`].
    pub async fn add_holder_rule(&self, r: &HolderRule) -> Result<Added, NetlinkError> {
        let mut req = self.handle().rule().add();
        *req.message_mut() = Self::holder_rule_message(r);
        match req.execute().await {
            Ok(()) => Ok(Added::New),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(Added::Present),
            Err(e) => Err(rule_error("add", r)(e)),
        }
    }

    /// Removes `r` if it is havip's (protocol 0x68); gone is success.
    pub async fn remove_holder_rule(&self, r: &HolderRule) -> Result<(), NetlinkError> {
        match self.handle().rule().del(Self::holder_rule_message(r)).execute().await {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(ENOENT) | Some(ESRCH)) => Ok(()),
            Err(e) => Err(rule_error("remove", r)(e)),
        }
    }

    /// Removes every rule of `rules`, then every route of `routes` (only havip's; gone is
    /// success), logging each removal at info with `why`. Every one is tried; what could
    /// not be removed comes back with its error.
    pub async fn remove_holder_all(&self, routes: &[HolderRoute], rules: &[HolderRule], why: &str) -> NotRemoved {
        let mut left = NotRemoved::default();
        for r in rules {
            match self.remove_holder_rule(r).await {
                Ok(()) => tracing::info!(what = %r, why, "removed a rule"),
                Err(e) => left.rules.push((r.clone(), e)),
            }
        }
        for r in routes {
            match self.remove_holder_route(r).await {
                Ok(()) => tracing::info!(what = %r, why, "removed a route"),
                Err(e) => left.routes.push((r.clone(), e)),
            }
        }
        left
    }
}

/// The routes and rules [`Netlink::remove_holder_all`] could not remove, each with why.
#[derive(Debug, Default)]
pub struct NotRemoved {
    /// Routes left.
    pub routes: Vec<(HolderRoute, NetlinkError)>,
    /// Rules left.
    pub rules: Vec<(HolderRule, NetlinkError)>,
}

impl NotRemoved {
    /// Whether everything went.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && self.rules.is_empty()
    }

    /// Each failure: what (`route …` / `rule …`) and why.
    pub fn failures(&self) -> impl Iterator<Item = (String, &NetlinkError)> {
        let routes = self.routes.iter().map(|(r, e)| (format!("route {r}"), e));
        routes.chain(self.rules.iter().map(|(r, e)| (format!("rule {r}"), e)))
    }
}

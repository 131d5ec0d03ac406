//! Replay protection on the receiving side: a [`ReplayWindow`] per (sender, path) over
//! sequence numbers, and per sender a [`SenderWindow`] that follows the sender's sessions
//! (see the module documentation of [`super`]).

use super::message::Session;

/// Why an authentic heartbeat was still refused by the [`ReplayWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The sequence number was seen before, or is too old for the window.
    #[error("replayed heartbeat (sequence {seq})")]
    Replayed {
        /// The sequence number.
        seq: u64,
    },
    /// The timestamp is further from the local clock than the freshness bound.
    #[error("stale heartbeat (timestamp {skew_ms} ms away from the local clock)")]
    Stale {
        /// Local clock minus the sender's timestamp.
        skew_ms: i64,
    },
    /// From a session of the sender that a newer session replaced: a replay.
    #[error("heartbeat of a replaced session {session:#x} of its sender")]
    RetiredSession {
        /// The session id.
        session: u64,
    },
    /// From a session that has not proved yet that it began after the receiver's start
    /// (it does not echo the receiver's session id) while another session of the same
    /// sender is current: a replay, or a restarted sender that has not heard us yet.
    #[error("heartbeat of an unconfirmed new session {session:#x} of its sender")]
    UnconfirmedSession {
        /// The session id.
        session: u64,
    },
}

impl ReplayError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Replayed { .. } => "replayed",
            Self::Stale { .. } => "stale",
            Self::RetiredSession { .. } => "retired_session",
            Self::UnconfirmedSession { .. } => "unconfirmed_session",
        }
    }

    /// Whether the datagram was refused as (possibly) replayed, as opposed to stale.
    pub fn is_replay(&self) -> bool {
        !matches!(self, Self::Stale { .. })
    }
}

/// Anti-replay state for one (sender, path): the highest sequence number seen and a
/// 64-entry bitmap of the ones just below it (as in IPsec), plus a freshness bound.
///
/// A sender's sequence starts at its start-up time in microseconds, so a restarted
/// sender continues above its previous sequence without persisting anything.
#[derive(Clone, Debug, Default)]
pub struct ReplayWindow {
    highest: Option<u64>,
    bitmap: u64,
}

impl ReplayWindow {
    /// Window width in sequence numbers.
    pub const WIDTH: u64 = 64;

    /// Checks and records `seq`/`timestamp_ms` against the local clock `now_ms`;
    /// `max_age_ms` bounds |now − timestamp|.
    pub fn check(&mut self, seq: u64, timestamp_ms: u64, now_ms: u64, max_age_ms: u64) -> Result<(), ReplayError> {
        let skew_ms = now_ms as i64 - timestamp_ms as i64;
        if skew_ms.unsigned_abs() > max_age_ms {
            return Err(ReplayError::Stale { skew_ms });
        }
        match self.highest {
            None => {
                self.highest = Some(seq);
                self.bitmap = 1;
            }
            Some(h) if seq > h => {
                let shift = seq - h;
                self.bitmap = if shift >= Self::WIDTH { 1 } else { (self.bitmap << shift) | 1 };
                self.highest = Some(seq);
            }
            Some(h) => {
                let back = h - seq;
                if back >= Self::WIDTH || self.bitmap & (1 << back) != 0 {
                    return Err(ReplayError::Replayed { seq });
                }
                self.bitmap |= 1 << back;
            }
        }
        Ok(())
    }
}

/// How many replaced sessions of one sender a receiver remembers (and refuses).
pub const RETIRED_SESSIONS: usize = 8;

/// Anti-replay state of one sender, as one receiver keeps it: the sender's current
/// session, the sessions it replaced (refused for good), and a [`ReplayWindow`] per path
/// within the current session.
///
/// A datagram of a **new** session is accepted when
/// - no session of the sender is known yet (the receiver just started), or
/// - it echoes the receiver's own session id: it was signed after the sender heard the
///   receiver's current incarnation, so it cannot be a replay of anything older than that.
///
/// A restarted sender is thus heard again one heartbeat after it hears the receiver,
/// whatever its clock says; a replay of a replaced session is refused forever; and a
/// datagram of an unconfirmed session is refused while the current session stands (a
/// replay of captured traffic cannot displace it). Senders of minor version 0 carry no
/// session: their sequence numbers are checked in a window of their own per path, as
/// before sessions existed.
#[derive(Clone, Debug, Default)]
pub struct SenderWindow {
    current: Option<u64>,
    /// Replaced sessions, oldest first (at most [`RETIRED_SESSIONS`]; the tests read it).
    pub(super) retired: std::collections::VecDeque<u64>,
    windows: std::collections::BTreeMap<String, ReplayWindow>,
    legacy: std::collections::BTreeMap<String, ReplayWindow>,
    /// Receiver's clock at the last datagram accepted in the current session.
    last_session_ms: u64,
}

impl SenderWindow {
    /// Checks and records a datagram of this sender received on `path`. `own_session` is
    /// the receiver's session id (what a confirmed new session echoes).
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &mut self,
        path: &str,
        session: Option<Session>,
        own_session: u64,
        seq: u64,
        timestamp_ms: u64,
        now_ms: u64,
        max_age_ms: u64,
    ) -> Result<(), ReplayError> {
        let skew_ms = now_ms as i64 - timestamp_ms as i64;
        if skew_ms.unsigned_abs() > max_age_ms {
            return Err(ReplayError::Stale { skew_ms });
        }
        let Some(sess) = session else {
            // A sender without sessions (minor 0). Once the sender spoke with sessions, a
            // datagram without one is a replay of its older traffic — unless the session
            // went silent for longer than the freshness bound (a downgrade: no datagram of
            // the session can still be fresh, so no session can be replayed any more).
            if self.current.is_some() && now_ms.saturating_sub(self.last_session_ms) <= max_age_ms {
                return Err(ReplayError::Replayed { seq });
            }
            self.retire_current();
            return self.legacy.entry(path.to_owned()).or_default().check(seq, timestamp_ms, now_ms, max_age_ms);
        };
        if self.current != Some(sess.id) {
            if self.retired.contains(&sess.id) {
                return Err(ReplayError::RetiredSession { session: sess.id });
            }
            if self.current.is_some() && sess.echo != own_session {
                return Err(ReplayError::UnconfirmedSession { session: sess.id });
            }
            self.retire_current();
            self.current = Some(sess.id);
        }
        self.windows.entry(path.to_owned()).or_default().check(seq, timestamp_ms, now_ms, max_age_ms)?;
        self.last_session_ms = now_ms;
        Ok(())
    }

    fn retire_current(&mut self) {
        if let Some(old) = self.current.take() {
            if self.retired.len() == RETIRED_SESSIONS {
                self.retired.pop_front();
            }
            self.retired.push_back(old);
        }
        self.windows.clear();
    }

    /// The sender's current session id, if one was accepted (what our heartbeats to it echo).
    pub fn session(&self) -> Option<u64> {
        self.current
    }
}

//! What the node's BGP speaker says — its sessions, and which of the VIPs held here it
//! advertises to which peer — asked over the speaker's own control socket, never assumed
//! from havip's side: FRR through a daemon's vty socket (`<dir>/bgpd.vty`, the protocol
//! `vtysh` speaks: a command ended by a NUL byte, the answer ended by three NUL bytes and
//! a status byte), BIRD through its control socket (`bird.ctl`, the line protocol `birdc`
//! speaks: numbered reply lines, `0000` ends a reply). No binary of either is needed in
//! the agent's image; the sockets are mounted from the node.
//!
//! One [`SpeakerConfig`] per agent process ([`configure`], from the command line); every
//! pair with routed VIPs asks the speaker every [`POLL`] and reports the answer
//! ([`SpeakerReport`]) in its status and metrics.

use serde_json::Value;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// How often a pair with routed VIPs asks the speaker.
pub const POLL: Duration = Duration::from_secs(5);
/// How long one question may take (connect, ask, read the answer).
const QUESTION_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest answer read (a BGP summary of a node is a few KiB).
const MAX_ANSWER: usize = 4 << 20;

/// The BGP speaker on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeakerKind {
    /// FRR (bgpd).
    Frr,
    /// BIRD 2.
    Bird,
}

impl SpeakerKind {
    /// The name users know it by.
    pub fn as_str(self) -> &'static str {
        match self {
            SpeakerKind::Frr => "FRR",
            SpeakerKind::Bird => "BIRD",
        }
    }
}

/// Where the speaker's control socket is, and which speaker it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeakerConfig {
    /// `None`: whichever socket exists, FRR's first.
    pub kind: Option<SpeakerKind>,
    /// FRR's vty directory (`bgpd.vty` in it; Debian: `/var/run/frr`).
    pub frr_dir: PathBuf,
    /// BIRD's control socket (Debian: `/run/bird/bird.ctl`).
    pub bird_socket: PathBuf,
    /// The kernel routing table the backup paths go to (HAPair `bgpBackupPaths`), which
    /// the speaker imports (FRR: `ip import-table`; BIRD: a `kernel` protocol on it).
    pub backup_table: u32,
}

impl Default for SpeakerConfig {
    fn default() -> Self {
        Self {
            kind: None,
            frr_dir: PathBuf::from("/var/run/frr"),
            bird_socket: PathBuf::from("/run/bird/bird.ctl"),
            backup_table: BACKUP_TABLE,
        }
    }
}

/// The kernel routing table of the backup paths unless `--bgp-backup-table` says
/// otherwise (0x68, havip's protocol number; FRR's `ip import-table` takes 1–252).
pub const BACKUP_TABLE: u32 = 104;

static CONFIG: OnceLock<SpeakerConfig> = OnceLock::new();

/// Sets the process's speaker configuration (once, at start; later calls are ignored).
pub fn configure(cfg: SpeakerConfig) {
    let _ = CONFIG.set(cfg);
}

/// The process's speaker configuration ([`SpeakerConfig::default`] unless configured).
pub fn configured() -> SpeakerConfig {
    CONFIG.get().cloned().unwrap_or_default()
}

/// Why the speaker could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    /// No control socket where the configuration says.
    #[error("no BGP speaker found: neither {frr} (FRR) nor {bird} (BIRD) exists")]
    NotFound {
        /// FRR's socket looked for.
        frr: String,
        /// BIRD's socket looked for.
        bird: String,
    },
    /// The socket could not be used.
    #[error("{speaker} at {path}: {source}")]
    Io {
        /// FRR or BIRD.
        speaker: &'static str,
        /// The socket.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("{speaker} at {path} did not answer within {timeout:?}")]
    Timeout {
        /// FRR or BIRD.
        speaker: &'static str,
        /// The socket.
        path: String,
        /// The bound.
        timeout: Duration,
    },
    /// The speaker refused the question or answered something unreadable.
    #[error("{speaker} answered `{question}` with: {answer}")]
    Answer {
        /// FRR or BIRD.
        speaker: &'static str,
        /// The question.
        question: String,
        /// What it said (shortened).
        answer: String,
    },
}

/// One BGP session of the speaker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The peer: its address (FRR), the protocol's neighbour address or name (BIRD).
    pub peer: String,
    /// The session's state as the speaker names it (`Established`, `Active`, …).
    pub state: String,
    /// Whether it is established.
    pub established: bool,
}

/// A VIP held here, and the peers the speaker advertises it to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertised {
    /// The VIP.
    pub address: IpAddr,
    /// The peers it is advertised to (empty: the speaker does not advertise it).
    pub peers: Vec<String>,
}

/// What the speaker said (or why it could not be asked).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SpeakerReport {
    /// The speaker asked (`None`: none found).
    pub kind: Option<SpeakerKind>,
    /// Why it could not be asked, or refused; `None` when it answered.
    pub error: Option<String>,
    /// Its BGP sessions.
    pub sessions: Vec<Session>,
    /// For each routed VIP held here, the peers it is advertised to.
    pub advertised: Vec<Advertised>,
}

impl SpeakerReport {
    /// Established sessions.
    pub fn established(&self) -> usize {
        self.sessions.iter().filter(|s| s.established).count()
    }

    /// Whether the speaker can carry routes at all: it answered and has an established
    /// session. A member whose speaker cannot is no ready target for routed VIPs.
    pub fn carries(&self) -> bool {
        self.error.is_none() && self.established() > 0
    }

    /// Held VIPs advertised to at least one peer.
    pub fn advertised_count(&self) -> usize {
        self.advertised.iter().filter(|a| !a.peers.is_empty()).count()
    }

    /// What is wrong, for a member that holds `held` routed VIPs: the speaker could not be
    /// asked, has no established session, or does not advertise a held VIP. `None`: fine.
    pub fn problem(&self) -> Option<String> {
        if let Some(e) = &self.error {
            return Some(e.clone());
        }
        if self.established() == 0 {
            return Some(match self.sessions.is_empty() {
                true => "the BGP speaker has no session".to_owned(),
                false => format!("no BGP session is established ({} configured)", self.sessions.len()),
            });
        }
        let missing: Vec<String> =
            self.advertised.iter().filter(|a| a.peers.is_empty()).map(|a| a.address.to_string()).collect();
        (!missing.is_empty()).then(|| format!("the BGP speaker does not advertise {}", missing.join(", ")))
    }
}

/// Asks the configured speaker for its sessions and what it advertises of `held` (the
/// routed VIPs this member holds); never fails: what went wrong is in the report.
pub async fn observe(cfg: &SpeakerConfig, held: &[IpAddr]) -> SpeakerReport {
    let kind = match cfg.kind {
        Some(k) => k,
        None if cfg.frr_dir.join("bgpd.vty").exists() => SpeakerKind::Frr,
        None if cfg.bird_socket.exists() => SpeakerKind::Bird,
        None => {
            let e = SpeakerError::NotFound {
                frr: cfg.frr_dir.join("bgpd.vty").display().to_string(),
                bird: cfg.bird_socket.display().to_string(),
            };
            return SpeakerReport { error: Some(e.to_string()), ..Default::default() };
        }
    };
    let r = match kind {
        SpeakerKind::Frr => observe_frr(&cfg.frr_dir.join("bgpd.vty"), held).await,
        SpeakerKind::Bird => observe_bird(&cfg.bird_socket, held).await,
    };
    match r {
        Ok((sessions, advertised)) => SpeakerReport { kind: Some(kind), error: None, sessions, advertised },
        Err(e) => SpeakerReport { kind: Some(kind), error: Some(e.to_string()), ..Default::default() },
    }
}

/// The host prefix of `ip` as the speakers (and the member status) write it.
pub(crate) fn host_route(ip: IpAddr) -> String {
    format!("{ip}/{}", crate::netlink::host_prefix(ip))
}

fn shorten(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

async fn observe_frr(socket: &Path, held: &[IpAddr]) -> Result<(Vec<Session>, Vec<Advertised>), SpeakerError> {
    let summary = frr_json(socket, "show bgp summary json").await?;
    let sessions = frr_sessions(&summary);
    let mut advertised = Vec::new();
    for ip in held {
        let family = if ip.is_ipv4() { "ipv4" } else { "ipv6" };
        let v = frr_json(socket, &format!("show bgp {family} unicast {} json", host_route(*ip))).await?;
        advertised.push(Advertised { address: *ip, peers: frr_advertised_to(&v) });
    }
    Ok((sessions, advertised))
}

async fn frr_json(socket: &Path, question: &str) -> Result<Value, SpeakerError> {
    let text = with_timeout("FRR", socket, frr_ask(socket, question)).await?;
    serde_json::from_str(&text).map_err(|_| SpeakerError::Answer {
        speaker: "FRR",
        question: question.to_owned(),
        answer: shorten(&text),
    })
}

async fn with_timeout<T>(
    speaker: &'static str,
    socket: &Path,
    f: impl std::future::Future<Output = Result<T, SpeakerError>>,
) -> Result<T, SpeakerError> {
    match tokio::time::timeout(QUESTION_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => Err(SpeakerError::Timeout { speaker, path: socket.display().to_string(), timeout: QUESTION_TIMEOUT }),
    }
}

/// One question to an FRR daemon's vty socket: the answer's text.
async fn frr_ask(socket: &Path, question: &str) -> Result<String, SpeakerError> {
    let io = |source| SpeakerError::Io { speaker: "FRR", path: socket.display().to_string(), source };
    let mut s = UnixStream::connect(socket).await.map_err(io)?;
    let mut q = question.as_bytes().to_vec();
    q.push(0);
    s.write_all(&q).await.map_err(io)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await.map_err(io)?;
        if n == 0 {
            return Err(SpeakerError::Answer {
                speaker: "FRR",
                question: question.to_owned(),
                answer: format!("connection closed mid-answer: {}", shorten(&String::from_utf8_lossy(&buf))),
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((text, status)) = frr_answer(&buf) {
            return match status {
                0 => Ok(text),
                _ => {
                    Err(SpeakerError::Answer { speaker: "FRR", question: question.to_owned(), answer: shorten(&text) })
                }
            };
        }
        if buf.len() > MAX_ANSWER {
            return Err(SpeakerError::Answer {
                speaker: "FRR",
                question: question.to_owned(),
                answer: format!("an answer longer than {MAX_ANSWER} bytes"),
            });
        }
    }
}

/// A complete vty answer in `buf`: its text and status byte (0: success), once it ends
/// with the three NUL bytes and the status.
pub(crate) fn frr_answer(buf: &[u8]) -> Option<(String, u8)> {
    let n = buf.len();
    if n < 4 || buf[n - 4..n - 1] != [0, 0, 0] {
        return None;
    }
    Some((String::from_utf8_lossy(&buf[..n - 4]).into_owned(), buf[n - 1]))
}

/// The sessions of `show bgp summary json` (every address family; a peer once).
pub(crate) fn frr_sessions(summary: &Value) -> Vec<Session> {
    let mut out: Vec<Session> = Vec::new();
    let families = summary.as_object().into_iter().flatten().map(|(_, f)| f);
    for f in families {
        for (peer, p) in f.get("peers").and_then(Value::as_object).into_iter().flatten() {
            if out.iter().any(|s| &s.peer == peer) {
                continue;
            }
            let state = p.get("state").and_then(Value::as_str).unwrap_or("Unknown").to_owned();
            out.push(Session { peer: peer.clone(), established: state == "Established", state });
        }
    }
    out.sort_by(|a, b| a.peer.cmp(&b.peer));
    out
}

/// The peers a locally originated prefix is advertised to (`show bgp … <prefix> json`):
/// empty unless the best path is this speaker's own.
pub(crate) fn frr_advertised_to(v: &Value) -> Vec<String> {
    let paths = v.get("paths").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let own_best = paths.iter().any(|p| {
        let best = p.pointer("/bestpath/overall").and_then(Value::as_bool).unwrap_or(false);
        let peer = p.pointer("/peer/peerId").and_then(Value::as_str).unwrap_or_default();
        let own = p.get("sourced").and_then(Value::as_bool).unwrap_or(false)
            || p.get("local").and_then(Value::as_bool).unwrap_or(false)
            || peer == "0.0.0.0"
            || peer == "::";
        best && own
    });
    if !own_best {
        return Vec::new();
    }
    let mut peers: Vec<String> =
        v.get("advertisedTo").and_then(Value::as_object).into_iter().flatten().map(|(k, _)| k.clone()).collect();
    peers.sort();
    peers
}

async fn observe_bird(socket: &Path, held: &[IpAddr]) -> Result<(Vec<Session>, Vec<Advertised>), SpeakerError> {
    with_timeout("BIRD", socket, async {
        let io = |source| SpeakerError::Io { speaker: "BIRD", path: socket.display().to_string(), source };
        let s = UnixStream::connect(socket).await.map_err(io)?;
        let mut bird = BufReader::new(s);
        // The greeting ("0001 BIRD 2.0.12 ready.").
        bird_reply(&mut bird, "").await?;
        let question = "show protocols all";
        let protocols = bird_ask(&mut bird, question).await?;
        bird_refused(&protocols, question, &[])?;
        let bgp = bird_bgp_protocols(&protocols);
        let mut advertised = Vec::new();
        for ip in held {
            let mut peers = Vec::new();
            let prefix = host_route(*ip);
            for p in bgp.iter().filter(|p| p.established) {
                let question = format!("show route {prefix} export {}", p.name);
                let routes = bird_ask(&mut bird, &question).await?;
                // 8001: "Network not found" — not exported to that peer.
                bird_refused(&routes, &question, &[8001])?;
                if bird_has_route(&routes, &prefix) {
                    peers.push(p.peer.clone());
                }
            }
            advertised.push(Advertised { address: *ip, peers });
        }
        let sessions =
            bgp.into_iter().map(|p| Session { peer: p.peer, state: p.state, established: p.established }).collect();
        Ok((sessions, advertised))
    })
    .await
}

async fn bird_ask(bird: &mut BufReader<UnixStream>, question: &str) -> Result<Vec<(u16, String)>, SpeakerError> {
    let io = |source| SpeakerError::Io { speaker: "BIRD", path: "bird.ctl".into(), source };
    bird.get_mut().write_all(format!("{question}\n").as_bytes()).await.map_err(io)?;
    bird_reply(bird, question).await
}

/// A reply whose code is an error (8000 and above: run-time errors, 9000 and above:
/// parse errors), unless it is one of `expected`.
fn bird_refused(lines: &[(u16, String)], question: &str, expected: &[u16]) -> Result<(), SpeakerError> {
    match lines.iter().find(|(c, _)| *c >= 8000 && !expected.contains(c)) {
        Some((c, t)) => Err(SpeakerError::Answer {
            speaker: "BIRD",
            question: question.to_owned(),
            answer: format!("{c} {}", shorten(t)),
        }),
        None => Ok(()),
    }
}

/// Reads one reply: its lines as (code, text) until the line that ends it (a code
/// followed by a space).
async fn bird_reply(bird: &mut BufReader<UnixStream>, question: &str) -> Result<Vec<(u16, String)>, SpeakerError> {
    let io = |source| SpeakerError::Io { speaker: "BIRD", path: "bird.ctl".into(), source };
    let mut lines = Vec::new();
    let mut code = 0u16;
    let mut total = 0usize;
    loop {
        let mut line = String::new();
        if bird.read_line(&mut line).await.map_err(io)? == 0 {
            return Err(SpeakerError::Answer {
                speaker: "BIRD",
                question: question.to_owned(),
                answer: "connection closed mid-reply".into(),
            });
        }
        total += line.len();
        if total > MAX_ANSWER {
            return Err(SpeakerError::Answer {
                speaker: "BIRD",
                question: question.to_owned(),
                answer: "too long".into(),
            });
        }
        let (c, last, text) = bird_line(line.trim_end_matches('\n'), code);
        code = c;
        lines.push((code, text));
        if last {
            return Ok(lines);
        }
    }
}

/// One line of a BIRD reply: (its code — `previous` for a continuation line starting
/// with a space —, whether it ends the reply, its text).
pub(crate) fn bird_line(line: &str, previous: u16) -> (u16, bool, String) {
    let b = line.as_bytes();
    if b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && (b[4] == b'-' || b[4] == b' ') {
        let code = line[..4].parse().unwrap_or(previous);
        return (code, b[4] == b' ', line[5..].to_owned());
    }
    (previous, false, line.strip_prefix(' ').unwrap_or(line).to_owned())
}

/// A BGP protocol of BIRD's `show protocols all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BirdBgp {
    pub(crate) name: String,
    pub(crate) peer: String,
    pub(crate) state: String,
    pub(crate) established: bool,
}

/// The BGP protocols of a `show protocols all` reply: each row (code 1002) starts a
/// protocol; its detail lines give `BGP state:` and `Neighbor address:`.
pub(crate) fn bird_bgp_protocols(lines: &[(u16, String)]) -> Vec<BirdBgp> {
    let mut out: Vec<BirdBgp> = Vec::new();
    let mut current: Option<usize> = None;
    for (code, text) in lines {
        if *code == 1002 {
            let cols: Vec<&str> = text.split_whitespace().collect();
            current = None;
            if cols.get(1) == Some(&"BGP") {
                let name = cols[0].to_owned();
                let state = cols.get(3).map(|s| (*s).to_owned()).unwrap_or_default();
                out.push(BirdBgp { peer: name.clone(), name, state, established: false });
                current = Some(out.len() - 1);
            }
            continue;
        }
        let Some(i) = current else { continue };
        let t = text.trim();
        if let Some(v) = t.strip_prefix("BGP state:") {
            out[i].state = v.trim().to_owned();
            out[i].established = v.trim() == "Established";
        } else if let Some(v) = t.strip_prefix("Neighbor address:") {
            out[i].peer = v.trim().to_owned();
        }
    }
    out
}

/// Whether a `show route <prefix> export <p>` reply lists a route for `prefix` (code
/// 1007, after its `Table …:` line).
pub(crate) fn bird_has_route(lines: &[(u16, String)], prefix: &str) -> bool {
    lines.iter().any(|(c, t)| *c == 1007 && t.trim_start().starts_with(prefix))
}

#[cfg(test)]
mod tests;

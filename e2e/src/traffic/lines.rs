//! The line protocol of the echo listeners and the connections that talk to them: a
//! name or an answer is one `\n`-terminated line of at most `MAX_LINE` (4096) bytes.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;

/// The longest line an echo listener or a long-lived connection buffers; a peer that
/// sends more without a newline is not one of ours and is dropped.
pub(super) const MAX_LINE: usize = 4096;

/// Reads one line (blocking, with the socket's read timeout); returns it and whatever
/// came after it.
pub(super) fn read_line(s: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        if let Some(end) = got.iter().position(|b| *b == b'\n') {
            let rest = got.split_off(end + 1);
            let line = String::from_utf8_lossy(&got).trim().to_owned();
            return Ok((line, rest));
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed before a full line")),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if got.len() > MAX_LINE {
            return Err(std::io::Error::new(ErrorKind::InvalidData, "line too long"));
        }
    }
}

//! The NBD wire protocol (the NBD project's doc/proto.md): constants, the
//! fixed-newstyle handshake (`NBD_OPT_STRUCTURED_REPLY`, then `NBD_OPT_GO` with
//! `NBD_INFO_BLOCK_SIZE`, `NBD_OPT_EXPORT_NAME` where GO is unsupported), and
//! the raw socket helpers of the transmission phase.
//!
//! Invariants: the handshake runs on a blocking socket with send and receive
//! timeouts (a silent server cannot hang `swapon` or a reconnect); after it the
//! receive timeout becomes a short tick (a receiver checks its deadline that
//! often; an idle connection is normal) and the send timeout stays (a sender never blocks forever on a full socket). All numbers
//! on the wire are big-endian. No locking here: one thread owns a socket while
//! it negotiates.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::uri::{NbdUri, Target};
use crate::page_io::{cvt, retry_eintr};

pub(crate) const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub(crate) const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
pub(crate) const REQUEST_MAGIC: u32 = 0x2560_9513;
pub(crate) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub(crate) const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;

const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;
const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

pub(crate) const TFLAG_READ_ONLY: u16 = 1 << 1;
pub(crate) const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub(crate) const TFLAG_SEND_DF: u16 = 1 << 7;
pub(crate) const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

pub(crate) const CMD_READ: u16 = 0;
pub(crate) const CMD_WRITE: u16 = 1;
pub(crate) const CMD_DISC: u16 = 2;
pub(crate) const CMD_TRIM: u16 = 4;
pub(crate) const CMD_FLAG_DF: u16 = 1 << 2;

pub(crate) const REPLY_FLAG_DONE: u16 = 1 << 0;
pub(crate) const REPLY_TYPE_NONE: u16 = 0;
pub(crate) const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub(crate) const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub(crate) const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;

/// Largest payload a portable client sends without an advertisement.
pub(crate) const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// What the server said about the export.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct ExportInfo {
    pub(crate) size: u64,
    pub(crate) flags: u16,
    pub(crate) min_block: u32,
    pub(crate) max_payload: u32,
    /// Structured replies were negotiated.
    pub(crate) structured: bool,
}

fn proto_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn set_timeo(fd: RawFd, opt: libc::c_int, t: Option<Duration>) -> io::Result<()> {
    let t = t.unwrap_or(Duration::ZERO);
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: plain setsockopt on an fd we own, with a correctly sized timeval.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Connects to the server, with `timeout` for the connection and every
/// handshake read or write.
pub(crate) fn connect(target: &Target, timeout: Duration) -> io::Result<OwnedFd> {
    let fd: OwnedFd = match target {
        Target::Unix(p) => UnixStream::connect(p)
            .map_err(|e| io::Error::new(e.kind(), format!("NBD socket {}: {e}", p.display())))?
            .into(),
        Target::Tcp(host, port) => {
            let mut last = None;
            let mut got = None;
            for a in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&a, timeout) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        got = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match got {
                Some(s) => s.into(),
                None => {
                    let e = last.unwrap_or_else(|| io::Error::other("no address"));
                    return Err(io::Error::new(
                        e.kind(),
                        format!("NBD server {host}:{port}: {e}"),
                    ));
                }
            }
        }
    };
    set_timeo(fd.as_raw_fd(), libc::SO_RCVTIMEO, Some(timeout))?;
    set_timeo(fd.as_raw_fd(), libc::SO_SNDTIMEO, Some(timeout))?;
    Ok(fd)
}

fn rd<const N: usize>(f: &mut File) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    f.read_exact(&mut b).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "NBD server closed the connection during the handshake",
            )
        } else {
            e
        }
    })?;
    Ok(b)
}
fn rd16(f: &mut File) -> io::Result<u16> {
    Ok(u16::from_be_bytes(rd(f)?))
}
fn rd32(f: &mut File) -> io::Result<u32> {
    Ok(u32::from_be_bytes(rd(f)?))
}
fn rd64(f: &mut File) -> io::Result<u64> {
    Ok(u64::from_be_bytes(rd(f)?))
}
fn skip(f: &mut File, n: u64) -> io::Result<()> {
    let got = io::copy(&mut (&mut *f).take(n), &mut io::sink())?;
    if got != n {
        return Err(proto_err("short option reply"));
    }
    Ok(())
}

fn send_opt(f: &mut File, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    f.write_all(&m)
}

/// One option reply header: (type, length).
fn opt_reply(f: &mut File, opt: u32) -> io::Result<(u32, u32)> {
    if rd64(f)? != REPLY_MAGIC_OPT {
        return Err(proto_err("bad option reply magic"));
    }
    if rd32(f)? != opt {
        return Err(proto_err("option reply for another option"));
    }
    Ok((rd32(f)?, rd32(f)?))
}

fn opt_error(ty: u32, what: &str, msg: &str) -> io::Error {
    let why = match ty {
        REP_ERR_TLS_REQD => "the server requires TLS, which is not supported yet",
        REP_ERR_UNKNOWN => "no such export on the server",
        REP_ERR_POLICY => "refused by the server's policy",
        REP_ERR_INVALID => "the server found the request invalid",
        REP_ERR_BLOCK_SIZE_REQD => "the server requires block-size negotiation",
        _ => "refused by the server",
    };
    let kind = match ty {
        REP_ERR_UNKNOWN => io::ErrorKind::NotFound,
        REP_ERR_TLS_REQD | REP_ERR_POLICY => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Unsupported,
    };
    io::Error::new(kind, format!("NBD {what}: {why} ({ty:#x}) {msg}"))
}

/// `NBD_OPT_GO`: `Ok(None)` when the server does not know it.
fn opt_go(f: &mut File, export: &str) -> io::Result<Option<(u64, u16, u32, u32)>> {
    let mut d = Vec::with_capacity(8 + export.len());
    d.extend_from_slice(&(export.len() as u32).to_be_bytes());
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&1u16.to_be_bytes());
    d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_opt(f, OPT_GO, &d)?;
    let (mut size, mut flags) = (None, 0);
    let (mut min_block, mut max_payload) = (1, DEFAULT_MAX_PAYLOAD);
    loop {
        let (ty, len) = opt_reply(f, OPT_GO)?;
        match ty {
            REP_ACK => break,
            REP_INFO if len >= 2 => {
                let info = rd16(f)?;
                match info {
                    INFO_EXPORT if len == 12 => {
                        size = Some(rd64(f)?);
                        flags = rd16(f)?;
                    }
                    INFO_BLOCK_SIZE if len == 14 => {
                        min_block = rd32(f)?;
                        let _preferred = rd32(f)?;
                        max_payload = rd32(f)?;
                    }
                    _ => skip(f, len as u64 - 2)?,
                }
            }
            REP_ERR_UNSUP => {
                skip(f, len as u64)?;
                return Ok(None);
            }
            t if t & REP_FLAG_ERROR != 0 => {
                let mut msg = vec![0; len.min(4096) as usize];
                f.read_exact(&mut msg)?;
                skip(f, len as u64 - msg.len() as u64)?;
                return Err(opt_error(t, "NBD_OPT_GO", &String::from_utf8_lossy(&msg)));
            }
            _ => skip(f, len as u64)?,
        }
    }
    let size = size.ok_or_else(|| proto_err("NBD_OPT_GO ended without NBD_INFO_EXPORT"))?;
    Ok(Some((size, flags, min_block, max_payload)))
}

/// Negotiates on a fresh connection up to the transmission phase.
pub(crate) fn handshake(fd: OwnedFd, uri: &NbdUri) -> io::Result<(OwnedFd, ExportInfo)> {
    let mut f = File::from(fd);
    if rd64(&mut f)? != NBDMAGIC {
        return Err(proto_err("not an NBD server (bad magic)"));
    }
    match rd64(&mut f)? {
        IHAVEOPT => {}
        CLISERV_MAGIC => return Err(proto_err("oldstyle NBD servers are not supported")),
        _ => return Err(proto_err("bad NBD handshake magic")),
    }
    let sflags = rd16(&mut f)?;
    let no_zeroes = sflags & FLAG_NO_ZEROES != 0;
    let fixed = sflags & FLAG_FIXED_NEWSTYLE != 0;
    let cflags = (fixed as u32) | ((no_zeroes as u32) << 1);
    f.write_all(&cflags.to_be_bytes())?;
    let mut structured = false;
    let mut go = None;
    if fixed {
        send_opt(&mut f, OPT_STRUCTURED_REPLY, &[])?;
        let (ty, len) = opt_reply(&mut f, OPT_STRUCTURED_REPLY)?;
        skip(&mut f, len as u64)?;
        structured = ty == REP_ACK;
        go = opt_go(&mut f, &uri.export)?;
    }
    let (size, flags, min_block, max_payload) = match go {
        Some(g) => g,
        None => {
            // NBD_OPT_EXPORT_NAME: no error reply; the server closes instead.
            send_opt(&mut f, OPT_EXPORT_NAME, uri.export.as_bytes())?;
            let size = rd64(&mut f).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("NBD_OPT_EXPORT_NAME {:?}: {e}", uri.export),
                )
            })?;
            let flags = rd16(&mut f)?;
            if !no_zeroes {
                skip(&mut f, 124)?;
            }
            (size, flags, 1, DEFAULT_MAX_PAYLOAD)
        }
    };
    let fd = OwnedFd::from(f);
    let max_payload = max_payload.clamp(4096, DEFAULT_MAX_PAYLOAD);
    Ok((
        fd,
        ExportInfo {
            size,
            flags,
            min_block,
            max_payload,
            structured,
        },
    ))
}

/// Sets the receive timeout of the transmission phase: a short tick after
/// which a receiver checks its deadline (an idle connection is normal).
pub(crate) fn set_rx_tick(fd: &OwnedFd, tick: Duration) -> io::Result<()> {
    set_timeo(fd.as_raw_fd(), libc::SO_RCVTIMEO, Some(tick))
}

/// A request header (28 bytes).
pub(crate) fn request(flags: u16, cmd: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&cmd.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&len.to_be_bytes());
    h
}

/// The error of a connection the server closed.
pub(crate) fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "NBD server closed the connection",
    )
}

/// Receives exactly `len` bytes into `p`. EOF is `ConnectionAborted`.
///
/// # Safety
/// `p` is valid for writes of `len` bytes and nothing else accesses it meanwhile.
pub(crate) unsafe fn recv_exact(fd: RawFd, p: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = retry_eintr(|| {
            // SAFETY: `p + done .. p + len` is inside the caller's buffer.
            cvt(unsafe { libc::recv(fd, p.add(done).cast(), len - done, libc::MSG_WAITALL) })
        })?;
        if n == 0 {
            return Err(closed());
        }
        done += n;
    }
    Ok(())
}

/// Receives into a byte array.
pub(crate) fn recv_buf(fd: RawFd, b: &mut [u8]) -> io::Result<()> {
    // SAFETY: `b` is an exclusively borrowed buffer of that length.
    unsafe { recv_exact(fd, b.as_mut_ptr(), b.len()) }
}

/// Sends all of `iov` (modified as it goes). No allocation.
pub(crate) fn sendv_all(fd: RawFd, mut iov: &mut [libc::iovec]) -> io::Result<()> {
    while !iov.is_empty() {
        let mut msg: libc::msghdr = {
            // SAFETY: msghdr is plain old data; all-zero is a valid value.
            unsafe { std::mem::zeroed() }
        };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len().min(1024) as _;
        // SAFETY: `msg` points at `iov`, whose entries point at live buffers
        // (the caller's); MSG_NOSIGNAL: a dead peer is an error, not SIGPIPE.
        let mut n = retry_eintr(|| cvt(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) }))?;
        while n > 0 && !iov.is_empty() {
            if n >= iov[0].iov_len {
                n -= iov[0].iov_len;
                iov = &mut iov[1..];
            } else {
                // SAFETY: advancing inside the same buffer by less than its length.
                iov[0].iov_base = unsafe { iov[0].iov_base.cast::<u8>().add(n) }.cast();
                iov[0].iov_len -= n;
                n = 0;
            }
        }
        while iov.first().is_some_and(|v| v.iov_len == 0) {
            iov = &mut iov[1..];
        }
    }
    Ok(())
}

/// Sends one buffer.
pub(crate) fn send_all(fd: RawFd, b: &[u8]) -> io::Result<()> {
    let mut iov = [libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: b.len(),
    }];
    sendv_all(fd, &mut iov)
}

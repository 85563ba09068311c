//! NBD URIs (the NBD project's doc/uri.md): `nbd://host[:port]/export` and
//! `nbd+unix:///export?socket=PATH`. The export name is the path without its
//! leading `/` (empty: the server's default export), percent-decoded. TLS
//! schemes (`nbds://`, `nbds+unix://`) and `tls-*` keys are refused with a clear
//! error until the client speaks `NBD_OPT_STARTTLS`.
//!
//! Invariants: a parsed [`NbdUri`] names exactly one transport and an export
//! name of at most 4096 bytes (the protocol's limit). No locking (pure parsing).

use std::io;
use std::path::PathBuf;

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A TCP host (name, IPv4, or IPv6 without brackets) and port.
    Tcp(String, u16),
    /// A Unix-domain socket.
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NbdUri {
    pub(crate) target: Target,
    pub(crate) export: String,
}

/// The IANA port of NBD.
pub(crate) const NBD_DEFAULT_PORT: u16 = 10809;

fn bad(uri: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("NBD URI {uri:?}: {why}"),
    )
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Percent-decodes `s` (UTF-8 required).
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let (h, l) = (hex(*b.get(i + 1)?)?, hex(*b.get(i + 2)?)?);
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl NbdUri {
    /// Parses `uri`; every refusal is `InvalidInput` saying why.
    pub(crate) fn parse(uri: &str) -> io::Result<NbdUri> {
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Err(bad(uri, "not a URI (expected nbd:// or nbd+unix://)"));
        };
        let unix = match scheme.to_ascii_lowercase().as_str() {
            "nbd" => false,
            "nbd+unix" => true,
            "nbds" | "nbds+unix" | "nbds+vsock" => {
                return Err(bad(
                    uri,
                    "TLS is not supported yet (use nbd:// or nbd+unix://)",
                ))
            }
            "nbd+vsock" => return Err(bad(uri, "vsock transport is not supported")),
            s => return Err(bad(uri, &format!("unknown scheme {s:?}"))),
        };
        if rest.contains('#') {
            return Err(bad(uri, "a fragment (#) is not allowed"));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = decode(path).ok_or_else(|| bad(uri, "bad percent-encoding in the export"))?;
        if export.len() > 4096 {
            return Err(bad(uri, "export name longer than 4096 bytes"));
        }
        let mut socket = None;
        for kv in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|s| !s.is_empty())
        {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let v = decode(v).ok_or_else(|| bad(uri, "bad percent-encoding in the query"))?;
            match k {
                "socket" if unix => socket = Some(PathBuf::from(v)),
                "socket" => return Err(bad(uri, "socket= is for nbd+unix:// only")),
                k if k.starts_with("tls") => {
                    return Err(bad(uri, "TLS is not supported yet (no tls-* keys)"))
                }
                k => return Err(bad(uri, &format!("unsupported query key {k:?}"))),
            }
        }
        let target = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    uri,
                    "nbd+unix:// takes no host (nbd+unix:///export?socket=PATH)",
                ));
            }
            match socket {
                Some(p) if !p.as_os_str().is_empty() => Target::Unix(p),
                _ => return Err(bad(uri, "nbd+unix:// needs ?socket=PATH")),
            }
        } else {
            Self::tcp(uri, authority)?
        };
        Ok(NbdUri { target, export })
    }

    fn tcp(uri: &str, authority: &str) -> io::Result<Target> {
        if authority.contains('@') {
            return Err(bad(uri, "user information is not allowed"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad(uri, "unclosed [ in the host"))?;
            match after {
                "" => (h, None),
                p => (
                    h,
                    Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad(uri, "junk after ]"))?,
                    ),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad(uri, "nbd:// needs a host (nbd://host[:port]/export)"));
        }
        let port = match port {
            None => NBD_DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(bad(uri, &format!("bad port {p:?}"))),
            },
        };
        Ok(Target::Tcp(host.to_string(), port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_unix_forms() {
        let u = NbdUri::parse("nbd://127.0.0.1:10810/swap").unwrap();
        assert_eq!(u.target, Target::Tcp("127.0.0.1".into(), 10810));
        assert_eq!(u.export, "swap");
        let u = NbdUri::parse("nbd://server").unwrap();
        assert_eq!(u.target, Target::Tcp("server".into(), NBD_DEFAULT_PORT));
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:99/a%20b").unwrap();
        assert_eq!(u.target, Target::Tcp("::1".into(), 99));
        assert_eq!(u.export, "a b");
        let u = NbdUri::parse("nbd+unix:///swap?socket=/tmp/nbd%2Esock").unwrap();
        assert_eq!(u.target, Target::Unix("/tmp/nbd.sock".into()));
        assert_eq!(u.export, "swap");
        let u = NbdUri::parse("nbd+unix://?socket=/s").unwrap();
        assert_eq!(u.export, "");
    }

    #[test]
    fn refusals_say_why() {
        for (uri, why) in [
            ("nbds://h/e", "TLS is not supported yet"),
            ("nbds+unix:///e?socket=/s", "TLS is not supported yet"),
            ("nbd://h/e?tls-type=psk", "TLS is not supported yet"),
            ("http://h/e", "unknown scheme"),
            ("h/e", "not a URI"),
            ("nbd:///e", "needs a host"),
            ("nbd://h:0/e", "bad port"),
            ("nbd://h:70000/e", "bad port"),
            ("nbd://h:x/e", "bad port"),
            ("nbd+unix:///e", "needs ?socket"),
            ("nbd+unix://h/e?socket=/s", "takes no host"),
            ("nbd://h/e?socket=/s", "for nbd+unix"),
            ("nbd://h/e?foo=1", "unsupported query key"),
            ("nbd://h/%zz", "percent-encoding"),
            ("nbd://u@h/e", "user information"),
            ("nbd+vsock://1/e", "vsock"),
        ] {
            let e = NbdUri::parse(uri).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{uri}");
            assert!(e.to_string().contains(why), "{uri}: {e}");
        }
    }
}

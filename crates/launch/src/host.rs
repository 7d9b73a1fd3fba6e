//! Where a process runs on the network: loopback, or an address inside a network namespace.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// The address a process binds and the network namespace it runs in.
///
/// The default is 127.0.0.1 in the caller's own namespace. A namespace (e.g. one made with
/// `ip netns add`, at `/var/run/netns/NAME`) lets tests cut, slow or lose a process's traffic
/// with the kernel's own tools without touching the rest of the machine. The caller must be
/// able to reach `ip` from its own namespace (a route to it), since readiness is checked from
/// there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The address it binds (and is reached at).
    pub ip: Ipv4Addr,
    /// The namespace's file, entered (setns(2)) between fork and exec; `None`: the caller's.
    pub netns: Option<PathBuf>,
}

impl Default for Host {
    fn default() -> Host {
        Host::loopback()
    }
}

impl Host {
    /// 127.0.0.1 in the caller's namespace.
    pub fn loopback() -> Host {
        Host {
            ip: Ipv4Addr::LOCALHOST,
            netns: None,
        }
    }

    /// `ip` inside the namespace whose file is `netns`.
    pub fn in_netns(ip: Ipv4Addr, netns: impl Into<PathBuf>) -> Host {
        Host {
            ip,
            netns: Some(netns.into()),
        }
    }

    /// `ip` and `port`.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// Makes `cmd` run in the namespace, if any. The namespace's file is opened now, so that a
    /// missing namespace is an error here rather than a failed exec.
    pub(crate) fn enter(&self, cmd: &mut Command) -> io::Result<()> {
        let Some(path) = &self.netns else {
            return Ok(());
        };
        let ns = File::open(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("network namespace {}: {e}", path.display()),
            )
        })?;
        // SAFETY: between fork and exec only setns(2) runs, which is async-signal-safe. The
        // file is owned by the closure (so open until exec) and is close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }
}

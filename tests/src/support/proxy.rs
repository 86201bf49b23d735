//! A TCP proxy on 127.0.0.1 in front of a real server (RabbitMQ), that can cut the network: every
//! connection through it is dropped and new ones are refused for a while, or accepted and never
//! answered (a peer that hangs: a half-dead host, a firewall dropping packets). A real network
//! fault for the clients behind it, while every other test keeps its direct connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running proxy; it stops (dropping every connection) when this drops.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    refuse_until: Arc<Mutex<Option<Instant>>>,
    /// While set (until when), new connections are accepted and held without an answer.
    silent_until: Arc<Mutex<Option<Instant>>>,
    /// Bumped on every cut: each connection task ends when it changes.
    cuts: watch::Sender<u64>,
    /// Bumped on every freeze: each connection stops forwarding, held open, until the next cut.
    freezes: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("a bound address");
        let refuse_until = Arc::new(Mutex::new(None::<Instant>));
        let silent_until = Arc::new(Mutex::new(None::<Instant>));
        let (cuts, _) = watch::channel(0u64);
        let (freezes, _) = watch::channel(0u64);
        let task = {
            let freezes = freezes.clone();
            let refuse_until = refuse_until.clone();
            let silent_until = silent_until.clone();
            let cuts = cuts.clone();
            tokio::spawn(async move {
                // Connections accepted while silent: held open, never answered, until the proxy
                // stops (a client must give up on them by itself).
                let mut held = Vec::new();
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let now = Instant::now();
                    let until = |at: &Mutex<Option<Instant>>| {
                        at.lock().unwrap().is_some_and(|until| now < until)
                    };
                    if until(&refuse_until) {
                        drop(client);
                        continue;
                    }
                    if until(&silent_until) {
                        held.push(client);
                        continue;
                    }
                    let mut cut = cuts.subscribe();
                    let mut freeze = freezes.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let mut client = client;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut.changed() => {}
                            // Both sockets stay open, nothing forwarded: a peer gone silent.
                            _ = freeze.changed() => { let _ = cut.changed().await; }
                        }
                    });
                }
            })
        };
        Self {
            addr,
            refuse_until,
            silent_until,
            cuts,
            freezes,
            task,
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every connection through the proxy now and refuses new ones for `outage`.
    pub fn cut_for(&self, outage: Duration) {
        *self.refuse_until.lock().unwrap() = Some(Instant::now() + outage);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Drops every connection through the proxy now; for `outage`, new connections are
    /// accepted (TCP) and never answered: the server seems to hang. They stay open, unanswered,
    /// after the outage too.
    pub fn cut_silently_for(&self, outage: Duration) {
        *self.silent_until.lock().unwrap() = Some(Instant::now() + outage);
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl TcpProxy {
    /// Stops forwarding on every connection through the proxy now, holding both ends open (no
    /// close reaches either side: a peer that went silent mid-conversation) until the next cut
    /// or the proxy drops. New connections are forwarded as before.
    pub fn freeze(&self) {
        self.freezes.send_modify(|n| *n += 1);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cuts.send_modify(|n| *n += 1);
    }
}

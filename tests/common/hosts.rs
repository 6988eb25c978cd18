//! Test hosts for multi-host scenarios: a [`Lab`] is a private network of
//! network namespaces made by `scripts/hosts.sh` (each namespace a host with
//! its own address), plus a private PostgreSQL and RabbitMQ listening on the
//! network's gateway address. Workers run on the hosts; faults cut a host's
//! link to one destination for real (nftables in the host's namespace:
//! dropped, reset, or lossy); a [`DelayProxy`] slows a link (this kernel has
//! no `sch_netem`). Dropping the lab removes its namespaces and rules, also
//! when the test failed.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{PrivateBroker, PrivatePostgres, Tuning, repo_dir};

/// What a host's link to a destination suffers.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Packets silently dropped, both ways.
    Blackhole,
    /// What the host sends arrives; every packet back is dropped (the
    /// broker takes a publish, its confirm never comes).
    Deaf,
    /// Packets refused with a TCP reset.
    Reset,
    /// This percentage of packets dropped, both ways.
    Loss(u8),
}

/// Which of the host's traffic a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Database,
    /// The broker's AMQP port, and its stream port when it has one.
    Broker,
    /// The broker's stream port alone (its AMQP port stays reachable).
    StreamPort,
    /// Every packet of the host (full isolation).
    All,
}

/// A private network with `hosts` hosts and its own database and (unless
/// made with [`Lab::database_only`]) broker.
pub struct Lab {
    pub id: u8,
    pub gateway: String,
    pub hosts: usize,
    pub pg: PrivatePostgres,
    broker: Option<PrivateBroker>,
}

fn hosts_sh(args: &[&str]) -> bool {
    Command::new("bash")
        .arg(repo_dir().join("scripts/hosts.sh"))
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl Lab {
    pub fn new(hosts: usize) -> Self {
        Self::with(hosts, true)
    }

    /// A lab without a broker of its own (e.g. for a [`RabbitCluster`]).
    pub fn database_only(hosts: usize) -> Self {
        Self::with(hosts, false)
    }

    /// A lab whose PostgreSQL keeps its data under `parent` (e.g. a
    /// [`super::SmallDisk`]).
    pub fn with_pg_in(hosts: usize, parent: &std::path::Path) -> Self {
        Self::build(hosts, true, Some(parent))
    }

    /// A lab whose broker also listens on a stream port
    /// ([`PrivateBroker::stream_url`]).
    pub fn with_streams(hosts: usize) -> Self {
        let mut lab = Self::build(hosts, false, None);
        lab.broker = Some(PrivateBroker::start_with_streams_on(&lab.gateway));
        lab
    }

    fn with(hosts: usize, broker: bool) -> Self {
        Self::build(hosts, broker, None)
    }

    fn build(hosts: usize, broker: bool, pg_parent: Option<&std::path::Path>) -> Self {
        let id = loop {
            let id = 1 + (super::rand_u16() % 250) as u8;
            // `up` refuses a lab that exists (another test's).
            if hosts_sh(&["up", &id.to_string(), &hosts.to_string()]) {
                break id;
            }
        };
        let gateway = format!("10.213.{id}.1");
        // Should a server fail to start, the namespaces still go.
        let guard = LabGuard(id);
        let pg = match pg_parent {
            Some(parent) => PrivatePostgres::start_under(parent, &gateway),
            None => PrivatePostgres::start_on(&gateway),
        };
        let broker = broker.then(|| PrivateBroker::start_on(&gateway));
        std::mem::forget(guard);
        Self {
            id,
            gateway,
            hosts,
            pg,
            broker,
        }
    }

    /// The lab's broker.
    pub fn broker(&self) -> &PrivateBroker {
        self.broker.as_ref().expect("a lab with a broker")
    }

    /// Settings whose database and broker are the lab's.
    pub fn tuning(&self, base: Tuning) -> Tuning {
        Tuning {
            server_admin_url: Some(self.pg.admin_url()),
            amqp_url: self.broker.as_ref().map(PrivateBroker::url),
            ..base
        }
    }

    /// The network namespace of host `h` (1-based).
    pub fn netns(&self, h: usize) -> String {
        assert!((1..=self.hosts).contains(&h));
        format!("obx{}-h{h}", self.id)
    }

    /// Host `h`'s address.
    pub fn addr(&self, h: usize) -> String {
        format!("10.213.{}.{}", self.id, 10 + h)
    }

    fn ports(&self, link: Link) -> String {
        match link {
            Link::Database => self.pg.port.to_string(),
            Link::Broker => match self.broker().stream_port() {
                Some(stream) => format!("{},{stream}", self.broker().port),
                None => self.broker().port.to_string(),
            },
            Link::StreamPort => self
                .broker()
                .stream_port()
                .expect("a lab with streams")
                .to_string(),
            Link::All => "all".into(),
        }
    }

    /// Applies `fault` to host `h`'s `link` (faults add up until healed).
    pub fn fault(&self, h: usize, link: Link, fault: Fault) {
        self.fault_ports(h, &self.ports(link), fault);
    }

    /// Applies `fault` to host `h`'s traffic with the gateway's `ports`
    /// (comma-separated), e.g. a [`DelayProxy`]'s.
    pub fn fault_ports(&self, h: usize, ports: &str, fault: Fault) {
        let (id, host) = (self.id.to_string(), h.to_string());
        let pct;
        let mut args = vec!["fault", &id, &host, ports];
        match fault {
            Fault::Blackhole => args.push("blackhole"),
            Fault::Deaf => args.push("deaf"),
            Fault::Reset => args.push("reset"),
            Fault::Loss(p) => {
                pct = p.to_string();
                args.extend(["loss", &pct]);
            }
        }
        assert!(hosts_sh(&args), "hosts.sh {args:?} failed");
    }

    /// Removes every fault of host `h`.
    pub fn heal(&self, h: usize) {
        assert!(hosts_sh(&["heal", &self.id.to_string(), &h.to_string()]));
    }
}

/// Removes lab `id` when dropped.
struct LabGuard(u8);

impl Drop for LabGuard {
    fn drop(&mut self) {
        hosts_sh(&["down", &self.0.to_string()]);
    }
}

impl Drop for Lab {
    /// Removes the hosts (killing what still runs on them) and their rules;
    /// the servers stop when the fields drop.
    fn drop(&mut self) {
        drop(LabGuard(self.id));
    }
}

/// A TCP proxy that delays every chunk by `delay` ± `jitter`, in order (a
/// slow link as the stream sees it; packet loss comes from a [`Fault`]).
pub struct DelayProxy {
    pub addr: SocketAddr,
    /// Connections accepted so far (each one a connection attempt of a
    /// client, whatever the server then answers).
    pub accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _connections: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    pub async fn start(
        listen_ip: &str,
        target: SocketAddr,
        delay: Duration,
        jitter: Duration,
    ) -> Self {
        let listener = TcpListener::bind((listen_ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            let mut pipes = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                pipes.spawn(delayed_pipe(cr, sw, delay, jitter));
                pipes.spawn(delayed_pipe(sr, cw, delay, jitter));
            }
        });
        Self {
            addr,
            accepted,
            _connections: task,
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self._connections.abort();
    }
}

/// Copies `from` to `to`, each chunk leaving `delay` ± `jitter` after it
/// arrived but never before the chunk ahead of it.
async fn delayed_pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    jitter: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut last_due = tokio::time::Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let spread = jitter.as_millis() as i64;
        let offset = if spread > 0 {
            (super::rand_u16() as i64 % (2 * spread + 1)) - spread
        } else {
            0
        };
        let this = delay.as_millis() as i64 + offset;
        let due = tokio::time::Instant::now() + Duration::from_millis(this.max(0) as u64);
        last_due = last_due.max(due);
        if tx.send((last_due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// A RabbitMQ cluster with one node per lab host (each in its own network
/// namespace, so a node can be cut off from the others for real), started
/// by `scripts/services.sh` with a shared cookie and
/// `cluster_partition_handling = pause_minority`.
pub struct RabbitCluster {
    lab_id: u8,
    hosts: Vec<usize>,
    dirs: Vec<std::path::PathBuf>,
    cookie: String,
    /// With TLS: the folder of the nodes' certificate files (one
    /// certificate naming every node's address), listened on at
    /// [`CLUSTER_TLS_PORT`] beside the plain port.
    tls: Option<std::path::PathBuf>,
}

/// The AMQP port of every node (each has its own address).
const CLUSTER_PORT: u16 = 5672;
/// The AMQPS port of every node of a TLS cluster.
const CLUSTER_TLS_PORT: u16 = 5671;

impl RabbitCluster {
    pub fn start(lab: &Lab, hosts: &[usize]) -> Self {
        Self::start_with(lab, hosts, None)
    }

    /// A cluster whose nodes also listen for AMQPS, with a certificate from
    /// `pki` for every node's address.
    pub fn start_tls(lab: &Lab, hosts: &[usize], pki: &super::tls::Pki) -> Self {
        Self::start_with(lab, hosts, Some(pki))
    }

    fn start_with(lab: &Lab, hosts: &[usize], pki: Option<&super::tls::Pki>) -> Self {
        let state = std::path::PathBuf::from(
            std::env::var("OUTBOXD_STATE_DIR").unwrap_or_else(|_| "/tmp".into()),
        );
        let cluster = Self {
            lab_id: lab.id,
            hosts: hosts.to_vec(),
            dirs: hosts
                .iter()
                .map(|h| state.join(format!("cluster-{}-h{h}", lab.id)))
                .collect(),
            cookie: super::unique("cookie").to_uppercase(),
            tls: None,
        };
        let mut cluster = cluster;
        if let Some(pki) = pki {
            let files = pki.dir.join(super::unique("cluster"));
            let ips: Vec<String> = (0..hosts.len()).map(|i| cluster.ip(i)).collect();
            let names: Vec<&str> = ips.iter().map(String::as_str).collect();
            pki.server_files(&files, super::tls::ServerCert::For(&names));
            cluster.tls = Some(files);
        }
        // The nodes boot side by side (each takes seconds).
        std::thread::scope(|s| {
            for i in 0..hosts.len() {
                let cluster = &cluster;
                s.spawn(move || cluster.start_node(i));
            }
        });
        let first = cluster.node_name(0);
        for i in 1..hosts.len() {
            for args in [&["stop_app"][..], &["join_cluster", &first], &["start_app"]] {
                assert!(cluster.ctl(i, args), "rabbitmqctl {args:?} on node {i}");
            }
        }
        cluster
    }

    fn ip(&self, i: usize) -> String {
        format!("10.213.{}.{}", self.lab_id, 10 + self.hosts[i])
    }

    /// The lab host node `i` runs on.
    pub fn host(&self, i: usize) -> usize {
        self.hosts[i]
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn url(&self, i: usize) -> String {
        format!("amqp://guest:guest@{}:{CLUSTER_PORT}/%2f", self.ip(i))
    }

    /// Node `i`'s AMQPS URL (a cluster started with [`RabbitCluster::start_tls`]).
    pub fn tls_url(&self, i: usize) -> String {
        format!("amqps://guest:guest@{}:{CLUSTER_TLS_PORT}/%2f", self.ip(i))
    }

    fn node_name(&self, i: usize) -> String {
        format!("outboxd-{CLUSTER_PORT}@{}", self.ip(i))
    }

    /// `services.sh rabbit ACTION DIR PORT ARGS…` for node `i`, on its host.
    fn services(&self, i: usize, action: &str, args: &[&str]) -> bool {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("obx{}-h{}", self.lab_id, self.hosts[i]),
            ])
            .arg("bash")
            .arg(repo_dir().join("scripts/services.sh"))
            .args(["rabbit", action])
            .arg(&self.dirs[i])
            .arg(CLUSTER_PORT.to_string())
            .args(args)
            .env("OUTBOXD_LISTEN", self.ip(i))
            .env("OUTBOXD_RABBIT_NODE_HOST", self.ip(i))
            .env("OUTBOXD_RABBIT_COOKIE", &self.cookie)
            .env(
                "OUTBOXD_RABBIT_CONF",
                "cluster_partition_handling = pause_minority",
            )
            .envs(self.tls.iter().flat_map(|files| {
                [
                    ("OUTBOXD_TLS_DIR".to_string(), files.display().to_string()),
                    (
                        "OUTBOXD_AMQPS_PORT".to_string(),
                        CLUSTER_TLS_PORT.to_string(),
                    ),
                ]
            }))
            .stdout(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// `rabbitmqctl ARGS` against node `i`.
    pub fn ctl(&self, i: usize, args: &[&str]) -> bool {
        self.services(i, "ctl", args)
    }

    /// Starts node `i` (again, after a kill: it rejoins the cluster).
    pub fn start_node(&self, i: usize) {
        assert!(self.services(i, "start", &[]), "starting cluster node {i}");
    }

    /// Kills node `i`'s Erlang VM with SIGKILL.
    pub fn kill9(&self, i: usize) {
        let pid =
            std::fs::read_to_string(self.dirs[i].join("rabbit.pid")).expect("rabbit pid file");
        let _ = Command::new("kill").arg("-KILL").arg(pid.trim()).status();
    }

    /// The node a worker's log says it connected to last.
    pub fn node_in_log(&self, log: &str) -> Option<usize> {
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("connected to RabbitMQ"))?;
        (0..self.len()).find(|&i| line.contains(&format!("@{}:", self.ip(i))))
    }
}

impl Drop for RabbitCluster {
    /// Kills the nodes (their data goes with them; a clean stop of a
    /// cluster takes long, and the lab's hosts go next anyway).
    fn drop(&mut self) {
        for i in 0..self.len() {
            if self.dirs[i].join("rabbit.pid").exists() {
                self.kill9(i);
            }
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

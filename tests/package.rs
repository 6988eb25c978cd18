//! How outboxd is installed: the Debian package built by
//! `scripts/package.sh`, installed with `dpkg -i` on this machine, run from
//! `/usr/bin/outboxd` as the package's own user against the test services,
//! its systemd unit checked by `systemd-analyze verify`, then purged; and
//! the Kubernetes manifests of `deploy/kubernetes`, validated offline
//! against the API schemas (`scripts/k8s-validate.sh`).

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use outboxd::demo::QueueReader;
use outboxd::producer::Message;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Purges the package when dropped, also when the test failed.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "outboxd"]).output();
    }
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debian_package_installs_runs_as_its_own_user_and_purges() {
    let env = TestEnv::new().await;
    let out_dir = env.dir.join("deb");
    let built = run(Command::new("bash")
        .arg(repo_dir().join("scripts/package.sh"))
        .args(["--binary", env!("CARGO_BIN_EXE_outboxd"), "--out"])
        .arg(&out_dir));
    let deb = String::from_utf8(built.stdout).unwrap().trim().to_string();
    assert!(deb.ends_with(".deb") && Path::new(&deb).exists(), "{deb}");

    let _ = Command::new("dpkg").args(["--purge", "outboxd"]).output();
    let _installed = Installed;
    run(Command::new("dpkg").args(["-i", &deb]));
    for path in [
        "/usr/bin/outboxd",
        "/etc/outboxd/outboxd.toml",
        "/etc/default/outboxd",
        "/lib/systemd/system/outboxd.service",
    ] {
        assert!(Path::new(path).exists(), "{path} not installed");
    }
    let conffiles = run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "outboxd"]));
    let conffiles = String::from_utf8_lossy(&conffiles.stdout);
    assert!(
        conffiles.contains("/etc/outboxd/outboxd.toml")
            && conffiles.contains("/etc/default/outboxd"),
        "{conffiles}"
    );
    run(Command::new("getent").args(["passwd", "outboxd"]));
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    let verified = match analyze {
        Ok(o) if o.status.success() => {
            run(Command::new("systemd-analyze")
                .args(["verify", "/lib/systemd/system/outboxd.service"]));
            "systemd-analyze verify: clean"
        }
        _ => "systemd-analyze not available",
    };

    // The installed binary, as the package's user, with its configuration
    // file and the URLs from the environment: drains what is there.
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    for i in 0..20 {
        env.db
            .enqueue(Message::new(format!("k{}", i % 5), "", queue.clone(), "x"))
            .await;
    }
    let as_user = |args: &[&str], extra: &[(&str, &str)]| {
        let mut cmd = Command::new("runuser");
        cmd.args([
            "-u",
            "outboxd",
            "--",
            "/usr/bin/outboxd",
            "--config",
            "/etc/outboxd/outboxd.toml",
        ])
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("DATABASE_URL", &env.worker_db_url)
        .env("AMQP_URL", amqp_url())
        .envs(extra.iter().copied())
        .current_dir("/");
        cmd.output().unwrap()
    };
    let drained = as_user(&["work", "--no-leasing", "--once", "--json"], &[]);
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    let (all, v) = read_and_judge(&mut reader, &env, 20, Duration::from_secs(20)).await;
    // A bad configuration exits 2, which the unit does not restart on.
    let bad = as_user(&["work"], &[("OUTBOXD_OUTBOX__BATCH_SIZE", "0")]);
    let unit = std::fs::read_to_string("/lib/systemd/system/outboxd.service").unwrap();

    run(Command::new("dpkg").args(["--purge", "outboxd"]));
    let user_gone = !Command::new("getent")
        .args(["passwd", "outboxd"])
        .status()
        .unwrap()
        .success();
    println!(
        "package {deb}: installed, {verified}; /usr/bin/outboxd as user outboxd drained 20 rows ({}); \
         bad configuration exit {:?}; purged (binary gone: {}, user gone: {user_gone})",
        v.summary(),
        bad.status.code(),
        !Path::new("/usr/bin/outboxd").exists()
    );
    assert!(all && v.is_clean(), "{v:?}");
    assert_eq!(
        bad.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(unit.contains("RestartPreventExitStatus=2"));
    assert!(!Path::new("/usr/bin/outboxd").exists());
    assert!(!Path::new("/etc/outboxd/outboxd.toml").exists());
    assert!(user_gone);
}

/// `scripts/k8s-validate.sh` over `files`: each manifest against the
/// Kubernetes API schemas.
fn k8s_validate(files: &[&Path]) -> std::process::Output {
    Command::new("bash")
        .arg(repo_dir().join("scripts/k8s-validate.sh"))
        .args(files)
        .current_dir(repo_dir())
        .output()
        .unwrap()
}

/// The manifests pass the schema validator, and a broken copy does not
/// (so the validator really looks); the probes they use are the worker's.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn the_kubernetes_manifests_validate_and_use_the_workers_probes() {
    let dir = repo_dir().join("deploy/kubernetes");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let good = k8s_validate(&refs);
    let report =
        String::from_utf8_lossy(&good.stderr).into_owned() + &String::from_utf8_lossy(&good.stdout);
    println!("{report}");
    assert!(good.status.success(), "{report}");
    for kind in [
        "deployment/outboxd",
        "poddisruptionbudget/outboxd",
        "configmap/outboxd",
        "secret/outboxd",
        "deployment/outboxd-ui",
        "service/outboxd-ui",
        "networkpolicy/outboxd",
    ] {
        assert!(
            report.contains(&format!("passed for resource {kind}")),
            "{report}"
        );
    }

    let deployment = std::fs::read_to_string(dir.join("deployment.yaml")).unwrap();
    let broken = std::env::temp_dir().join(unique("broken-deployment") + ".yaml");
    std::fs::write(
        &broken,
        deployment.replace("replicas: 3", "replicas: three"),
    )
    .unwrap();
    let bad = k8s_validate(&[&broken]);
    let _ = std::fs::remove_file(&broken);
    assert!(!bad.status.success(), "a broken manifest passed");

    for probe in ["path: /livez", "path: /readyz"] {
        assert!(deployment.contains(probe), "{probe}");
    }
    let config = std::fs::read_to_string(dir.join("configmap.yaml")).unwrap();
    assert!(config.contains("health_listen = \"0.0.0.0:9090\""));
    assert!(deployment.contains("containerPort: 9090"));

    // Every image is this release's, and kustomize's tag says the same.
    let version = env!("CARGO_PKG_VERSION");
    for file in ["deployment.yaml", "dashboard.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let images: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image: "))
            .collect();
        assert!(!images.is_empty(), "{file}");
        for image in images {
            assert!(image.ends_with(&format!(":{version}")), "{file}: {image}");
        }
    }
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    assert!(kustomization.contains(&format!("newTag: {version}")));
}

/// The OCI image (`Containerfile`, built by `scripts/image.sh` with buildah
/// from this build's binary): it runs as user 10001 with nothing but the
/// binary, its libraries and CA certificates, says its version, and drains
/// messages from inside against the test services.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_builds_runs_as_its_user_and_drains_from_inside() {
    let env = TestEnv::new().await;
    let queue = unique("q");
    let mut reader = QueueReader::open(&amqp_url(), &queue).await.unwrap();
    for i in 0..20 {
        env.db
            .enqueue(Message::new(
                format!("k{i}"),
                "",
                queue.clone(),
                "from the image",
            ))
            .await;
    }
    let tag = format!("outboxd-test:{}", unique("t"));
    let started = std::time::Instant::now();
    let built = Command::new("bash")
        .arg(repo_dir().join("scripts/image.sh"))
        .args(["--bin", BIN, "--tag", &tag])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    println!("image built in {:.1} s", started.elapsed().as_secs_f64());
    let buildah = |args: &[&str]| {
        let out = Command::new("buildah").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "buildah {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let user = buildah(&[
        "inspect",
        "--storage-driver",
        "vfs",
        "--format",
        "{{.OCIv1.Config.User}}",
        &tag,
    ]);
    assert_eq!(user, "10001:10001");
    let ctr = buildah(&["from", "--storage-driver", "vfs", &tag]);
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--isolation", "chroot", "--storage-driver", "vfs"];
        all.extend_from_slice(args);
        buildah(&all)
    };
    let version = run(&[&ctr, "--", "/usr/bin/outboxd", "--version"]);
    assert_eq!(version, format!("outboxd {}", env!("CARGO_PKG_VERSION")));
    let whoami = run(&[&ctr, "--", "/usr/bin/outboxd", "partition", "k1"]);
    assert!(whoami.ends_with("k1"), "{whoami}");
    let database = format!("DATABASE_URL={}", env.worker_db_url);
    let broker = format!("AMQP_URL={}", amqp_url());
    run(&[
        "--env",
        &database,
        "--env",
        &broker,
        &ctr,
        "--",
        "/usr/bin/outboxd",
        "work",
        "--no-leasing",
        "--once",
        "--silent",
    ]);
    let (all, verdict) = read_and_judge(&mut reader, &env, 20, Duration::from_secs(30)).await;
    buildah(&["rm", "--storage-driver", "vfs", &ctr]);
    buildah(&["rmi", "--storage-driver", "vfs", &tag]);
    assert!(all && verdict.is_clean(), "{verdict:?}");
}

/// The manifests' worker Pod run the way the kubelet would
/// (`scripts/k8s-pod.py`: its uid, gid and fsGroup, its Secret and
/// ConfigMap files with the kubelet's owners and modes, its arguments and
/// environment): its init container migrates a fresh database and the
/// worker's /readyz answers 200. The same Pod without the fsGroup and with
/// the Secret at 0400 — what an earlier manifest shipped — cannot read its
/// Secret and exits 2 (a crash loop in a cluster). With the manifests'
/// stream lines uncommented, as docs/streams.md's users do, the worker
/// reads the stream port from the Secret and is ready once it reaches it;
/// with that port closed it is not.
#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_worker_pod_migrates_and_reaches_ready() {
    let env = TestEnv::with(Tuning {
        migrate: false,
        ..Tuning::default()
    })
    .await;
    let kit = |deployment: &Path, configmap: &Path, extra: &[&str]| -> serde_json::Value {
        let root = env.dir.join(unique("pod"));
        let out = Command::new("bash")
            .arg(repo_dir().join("scripts/k8s-validate.sh"))
            .arg("--pod")
            .arg("--deployment")
            .arg(deployment)
            .arg("--configmap")
            .arg(configmap)
            .args([
                "--root",
                root.to_str().unwrap(),
                "--bin",
                BIN,
                "--secret",
                &format!("database-url={}", env.worker_db_url),
                "--secret",
                &format!("amqp-url={}", amqp_url()),
            ])
            .args(extra)
            .current_dir(repo_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let deployment = repo_dir().join("deploy/kubernetes/deployment.yaml");
    let configmap = repo_dir().join("deploy/kubernetes/configmap.yaml");
    let pod = |extra: &[&str]| kit(&deployment, &configmap, extra);
    let shipped = pod(&[]);
    println!("as shipped: {shipped}");
    assert_eq!(shipped["init"][0]["name"], "migrate", "{shipped}");
    assert_eq!(shipped["init"][0]["code"], 0, "{shipped}");
    assert_eq!(shipped["ready"], true, "{shipped}");

    let old = pod(&["--no-fs-group", "--secret-mode", "0400"]);
    println!("without fsGroup, Secret at 0400: {old}");
    assert_eq!(old["init"][0]["code"], 2, "{old}");
    let said = old["init"][0]["stderr"].as_str().unwrap();
    assert!(
        said.contains("DATABASE_URL_FILE: cannot read") && said.contains("Permission denied"),
        "{said}"
    );
    assert_eq!(old["ready"], false, "{old}");

    // The stream lines, uncommented.
    let streaming_deployment = env.dir.join(unique("deployment")).with_extension("yaml");
    let streaming_configmap = env.dir.join(unique("configmap")).with_extension("yaml");
    std::fs::write(
        &streaming_deployment,
        uncommented(
            &deployment,
            &[
                "OUTBOXD_AMQP__STREAM_URL_FILE",
                "secrets/stream-url",
                "key: stream-url",
                "path: stream-url",
            ],
        ),
    )
    .unwrap();
    std::fs::write(
        &streaming_configmap,
        uncommented(&configmap, &["[amqp]", "streams = ["]),
    )
    .unwrap();
    let valid = k8s_validate(&[&streaming_deployment, &streaming_configmap]);
    assert!(
        valid.status.success(),
        "{}{}",
        String::from_utf8_lossy(&valid.stdout),
        String::from_utf8_lossy(&valid.stderr)
    );
    let streams = common::streams::stream_url();
    let with_streams = kit(
        &streaming_deployment,
        &streaming_configmap,
        &["--secret", &format!("stream-url={streams}")],
    );
    println!("with streams: {with_streams}");
    assert_eq!(with_streams["ready"], true, "{with_streams}");
    // A port nothing listens on once the probe's listener is dropped.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = format!("rabbitmq-stream://guest:guest@127.0.0.1:{port}/%2f");
    let unreachable = kit(
        &streaming_deployment,
        &streaming_configmap,
        &[
            "--secret",
            &format!("stream-url={closed}"),
            "--timeout",
            "8",
        ],
    );
    println!("with the stream port closed: {unreachable}");
    assert_eq!(unreachable["ready"], false, "{unreachable}");
    let said = unreachable["stderr"].as_str().unwrap();
    assert!(said.contains("cannot reach the stream port"), "{said}");
}

/// `path`'s text with each commented line that holds one of `markers`
/// uncommented (its `# ` removed, the indentation kept); every marker must
/// be found.
fn uncommented(path: &Path, markers: &[&str]) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut found = vec![false; markers.len()];
    let mut out = String::new();
    for line in text.lines() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        match (
            body.strip_prefix("# "),
            markers.iter().position(|m| body.contains(m)),
        ) {
            (Some(rest), Some(i)) => {
                found[i] = true;
                out.push_str(indent);
                out.push_str(rest);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    for (marker, found) in markers.iter().zip(found) {
        assert!(
            found,
            "no commented line with {marker:?} in {}",
            path.display()
        );
    }
    out
}

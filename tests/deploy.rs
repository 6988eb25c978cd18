//! The deployment kit as code: the alert rules pass `promtool check rules`
//! and their unit tests (`deploy/prometheus/rules.test.yaml`: for every rule
//! a series that fires it and one that does not) pass `promtool test rules`.

use std::path::PathBuf;
use std::process::Command;

fn prometheus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus")
}

fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): scripts/test.sh installs it (Debian's prometheus)")
        })
}

#[cfg_attr(
    not(feature = "services"),
    ignore = "needs PostgreSQL, MariaDB and RabbitMQ: scripts/test.sh runs it"
)]
#[test]
fn the_alert_rules_are_valid_and_each_fires_on_its_test_series_only() {
    for args in [
        ["check", "rules", "rules.yaml"],
        ["test", "rules", "rules.test.yaml"],
    ] {
        let out = promtool(&args);
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every rule has a test.
    let rules = std::fs::read_to_string(prometheus_dir().join("rules.yaml")).unwrap();
    let tests = std::fs::read_to_string(prometheus_dir().join("rules.test.yaml")).unwrap();
    for name in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "no unit test for {name}"
        );
    }
}

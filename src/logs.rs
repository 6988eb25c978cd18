//! Log lines: to stderr, as text or one JSON object per line, filtered by
//! `OUTBOXD_LOG` over quiet defaults for noisy dependencies; and, once a
//! worker knows its name ([`name_this_process`]), every line names it
//! (`worker=<name>` at the end of a text line, `"worker"` first in a JSON
//! object) — the name `outboxd status` and the dashboard show.

use std::io::Write;
use std::sync::OnceLock;

use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;

/// The worker's name, as a text suffix and a JSON member, once set.
static STAMP: OnceLock<Stamp> = OnceLock::new();

struct Stamp {
    text: String,
    json: String,
}

/// From now on every log line of this process names `name`. The first
/// call wins (one process, one worker).
pub fn name_this_process(name: &str) {
    let _ = STAMP.set(Stamp {
        text: format!(" worker={name}"),
        json: format!("\"worker\":{},", serde_json::Value::from(name)),
    });
}

/// Logging to stderr, as text or one JSON object per line, filtered by
/// [`log_filter`].
pub fn init(silent: bool, format: LogFormat) {
    let filter = log_filter(silent, std::env::var("OUTBOXD_LOG").ok().as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stamped(format))
        // If stderr goes away (a closed log pipe), dropping the line is
        // right; the default reports the failure with eprintln!, which
        // panics the logging task — and a panicked signal task meant a
        // worker that ignored SIGTERM.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => {
            use std::io::IsTerminal;
            builder
                .with_ansi(std::io::stderr().is_terminal())
                .with_target(false)
                .init();
        }
        // {"timestamp", "level", "target", "message", and the event's
        // fields}, one object per line.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

/// Dependencies kept quiet unless `OUTBOXD_LOG` names them. lapin logs
/// every returned message at WARN with its whole content (payload and
/// headers), and a channel the broker closed as an ERROR with its debug
/// form; the relay reports each failure itself, once, with the row id and
/// the broker's reason. sqlx's pool pings a connection released after an
/// error and warns when that fails too: the same failure said twice (and a
/// second line after a command's one-line error).
const QUIETED: [(&str, &str); 3] = [
    ("sqlx", "warn"),
    ("sqlx_core::pool::connection", "error"),
    ("lapin", "off"),
];

/// The log filter: `info` (`warn` with `--silent`) and [`QUIETED`], with
/// the directives of `OUTBOXD_LOG` over them — a bare level replaces the
/// level, a target it names replaces that target's quieting, and a target
/// it does not name stays quiet.
fn log_filter(silent: bool, user: Option<&str>) -> tracing_subscriber::EnvFilter {
    let user: Vec<&str> = user
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let target_of = |d: &str| d.split(['=', '[']).next().unwrap_or_default().to_string();
    let names_level = user.iter().any(|d| !d.contains('='));
    let mut directives: Vec<String> = Vec::new();
    if !names_level {
        directives.push(if silent { "warn" } else { "info" }.into());
    }
    for (target, level) in QUIETED {
        if !user
            .iter()
            .any(|d| d.contains('=') && target_of(d) == target)
        {
            directives.push(format!("{target}={level}"));
        }
    }
    directives.extend(user.iter().map(|d| d.to_string()));
    tracing_subscriber::EnvFilter::try_new(directives.join(",")).unwrap_or_else(|_| {
        let quiet: Vec<String> = QUIETED.iter().map(|(t, l)| format!("{t}={l}")).collect();
        tracing_subscriber::EnvFilter::new(format!("info,{}", quiet.join(",")))
    })
}

/// Stderr, adding the worker's name to each line. The formatter hands over
/// one whole line per write.
struct Stamped(LogFormat);

impl<'a> MakeWriter<'a> for Stamped {
    type Writer = StampedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        StampedWriter(self.0)
    }
}

struct StampedWriter(LogFormat);

impl Write for StampedWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        match STAMP.get() {
            Some(stamp) => err.write_all(&stamped(self.0, stamp, line))?,
            None => err.write_all(line)?,
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `line` naming the worker: the text suffix before the line's end, or the
/// JSON member after the object's opening brace.
fn stamped(format: LogFormat, stamp: &Stamp, line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() + stamp.text.len() + 4);
    match format {
        LogFormat::Text => {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            out.extend_from_slice(body);
            out.extend_from_slice(stamp.text.as_bytes());
            out.extend_from_slice(&line[body.len()..]);
        }
        LogFormat::Json => match line.strip_prefix(b"{") {
            Some(rest) => {
                out.push(b'{');
                out.extend_from_slice(stamp.json.as_bytes());
                out.extend_from_slice(rest);
            }
            None => out.extend_from_slice(line),
        },
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outboxd_log_keeps_dependencies_quiet_unless_it_names_them() {
        let shown = |f: tracing_subscriber::EnvFilter| f.to_string();
        let f = shown(log_filter(false, Some("debug")));
        assert!(
            f.contains("lapin=off") && f.contains("sqlx=warn") && f.contains("debug"),
            "{f}"
        );
        assert!(!f.contains("info"), "{f}");
        let f = shown(log_filter(false, Some("lapin=warn,outboxd=trace")));
        assert!(
            !f.contains("lapin=off") && f.contains("lapin=warn") && f.contains("info"),
            "{f}"
        );
        let f = shown(log_filter(true, None));
        assert!(f.contains("warn") && f.contains("lapin=off"), "{f}");
    }

    #[test]
    fn a_stamped_line_names_the_worker_in_either_format() {
        let stamp = Stamp {
            text: " worker=a\"b".into(),
            json: format!("\"worker\":{},", serde_json::Value::from("a\"b")),
        };
        let text = stamped(
            LogFormat::Text,
            &stamp,
            b"2026 INFO lease acquired bucket=p01\n",
        );
        assert_eq!(text, b"2026 INFO lease acquired bucket=p01 worker=a\"b\n");
        let json = stamped(LogFormat::Json, &stamp, b"{\"level\":\"INFO\"}\n");
        let parsed: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(parsed["worker"], "a\"b");
        assert_eq!(parsed["level"], "INFO");
    }
}

/// User data (a message key, a broker's reply naming an exchange) as it
/// may appear in a log line or a terminal: every character that could
/// forge a line, move the cursor or hide text — controls (escape sequences
/// included), line and paragraph separators, and Unicode's
/// Default_Ignorable_Code_Point set (bidirectional controls, zero-width
/// characters, variation selectors, tag characters) — written as
/// `\u{XXXX}`, the form the dashboard shows as `⟨U+XXXX⟩`.
pub struct Visible<'a>(pub &'a str);

impl std::fmt::Display for Visible<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            if hidden(c) {
                write!(f, "\\u{{{:04X}}}", u32::from(c))?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// Unicode 15's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt).
const DEFAULT_IGNORABLE: [(u32, u32); 17] = [
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
];

/// Whether `c` is written escaped by [`Visible`].
pub fn hidden(c: char) -> bool {
    let n = u32::from(c);
    c.is_control()
        || n == 0x2028
        || n == 0x2029
        || DEFAULT_IGNORABLE
            .iter()
            .any(|&(lo, hi)| (lo..=hi).contains(&n))
}

#[cfg(test)]
mod visible_tests {
    use super::Visible;

    #[test]
    fn escapes_what_could_forge_or_hide_a_line_and_nothing_else() {
        let key = "a\u{1b}[2Jb\nc\u{202E}d\u{E0069}e\u{034F}f\u{FE0F}g\u{2028}h\u{17B4}é中";
        assert_eq!(
            Visible(key).to_string(),
            "a\\u{001B}[2Jb\\u{000A}c\\u{202E}d\\u{E0069}e\\u{034F}f\\u{FE0F}g\\u{2028}h\\u{17B4}é中"
        );
    }
}

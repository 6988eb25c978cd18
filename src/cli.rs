//! Command-line definitions (clap) and dispatch of subcommands.
//!
//! Every failure ends as one line on stderr, `outboxd: <what went wrong>`,
//! and a non-zero exit: 2 for bad input (flags, configuration), 1 for a
//! failure while running. Never a panic backtrace.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::config::env::{Provenance, Source};
use crate::config::{Config, ConfigError, LogFormat, Redacted};
use crate::partitioner::Partitioner;
use crate::store::{Store, schema};
use crate::{demo, worker};

/// outboxd: relays a transactional outbox (PostgreSQL, MySQL/MariaDB, SQLite) to RabbitMQ, in order.
#[derive(Debug, Clone, Parser)]
#[command(name = "outboxd", version, about, long_about = None)]
pub struct Cli {
    /// Configuration file [default: config/outboxd.toml if it exists, else built-in defaults]
    #[arg(long, global = true, env = "OUTBOXD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Database URL: postgres://, mysql://, mariadb:// or sqlite:// (overrides DATABASE_URL and the file)
    #[arg(long, global = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// RabbitMQ URL: amqp:// or amqps://, several separated by commas (overrides AMQP_URL and the file)
    #[arg(long, global = true, value_name = "URL")]
    pub amqp_url: Option<String>,
    /// The source (a `[[source]]` name) the command acts on; `work` serves every source without it
    #[arg(long, global = true, value_name = "NAME")]
    pub source: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox schema (tables, indexes, SQL functions)
    Migrate {
        /// Every configured source's database, one after the other
        #[arg(long)]
        all_sources: bool,
    },
    /// Relay outbox rows to RabbitMQ
    Work(WorkArgs),
    /// Serve the web dashboard (reads the database: shows the whole fleet)
    Ui {
        /// Address to listen on [default: dashboard.listen, 127.0.0.1:8080]
        #[arg(long, value_name = "ADDR", value_parser = crate::config::parse_addr)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Workers, leases, per-bucket pending and lag, blocked heads (the dashboard in a terminal)
    Status(crate::ops::StatusArgs),
    /// Parked (failed) messages: list, requeue, drop
    Failed {
        #[command(subcommand)]
        command: crate::ops::FailedCommand,
    },
    /// Delete published rows older than a cut-off (in small batches)
    Purge(crate::ops::PurgeArgs),
    /// RabbitMQ streams: declare them with their retention
    Streams {
        #[command(subcommand)]
        command: crate::stream::declare::StreamsCommand,
    },
    /// Change the bucket count: re-labels unpublished rows while no worker runs
    Repartition(crate::ops::RepartitionArgs),
    /// Demo producer: enqueue order events for many keys
    Produce(demo::ProduceArgs),
    /// Demo consumer: read a queue or a stream and check per-key order, repeats and loss
    Consume(demo::ConsumeArgs),
    /// Print the bucket label of each message key
    Partition {
        /// Message keys
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Print the effective configuration (secrets redacted) and check it
    Config,
}

impl Command {
    /// Whether the command connects to the broker, and so needs what
    /// [`Config::validate_broker`] checks: the dashboard, `migrate` and the
    /// commands that only read or change the database run without the
    /// broker's files and stream port. `config` checks as a worker would.
    pub fn uses_broker(&self) -> bool {
        match self {
            Command::Work(_)
            | Command::Streams { .. }
            | Command::Repartition(_)
            | Command::Produce(_)
            | Command::Consume(_)
            | Command::Config => true,
            Command::Migrate { .. }
            | Command::Ui { .. }
            | Command::Status(_)
            | Command::Failed { .. }
            | Command::Purge(_)
            | Command::Partition { .. } => false,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct WorkArgs {
    /// Single-worker development mode: drain every bucket without leases.
    /// Refuses to start while other workers are live.
    #[arg(long)]
    pub no_leasing: bool,
    /// Drain what is ready now, print one report, exit
    #[arg(long)]
    pub once: bool,
    /// Print one JSON object per tick on stdout
    #[arg(long, conflicts_with = "silent")]
    pub json: bool,
    /// Print nothing on stdout; log warnings and errors only
    #[arg(long)]
    pub silent: bool,
    /// Length of a tick in milliseconds (how often --json prints)
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub interval_ms: u64,
    /// Window in seconds over which the human-readable rate line aggregates
    #[arg(long, value_name = "S", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub window: u64,
    /// Rows per batch (overrides outbox.batch_size)
    #[arg(long, value_name = "N")]
    pub batch_size: Option<u32>,
    /// Also serve the dashboard on ADDR (e.g. 127.0.0.1:8080)
    #[arg(long, value_name = "ADDR", value_parser = crate::config::parse_addr)]
    pub ui: Option<std::net::SocketAddr>,
}

/// Parses the command line, runs the command, returns the exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            crate::complain!(
                "outboxd: {} (see outboxd --help)",
                usage_line(&e.render().to_string())
            );
            return ExitCode::from(2);
        }
    };
    let silent = matches!(&cli.command, Command::Work(w) if w.silent);
    let (config, provenance) = match load_config(&cli).and_then(|(c, p)| Ok((scoped(&cli, c)?, p)))
    {
        Ok(c) => c,
        Err(e) => {
            let format = log_format_asked(&cli);
            crate::logs::init(silent, format);
            fatal(format, &format!("outboxd: config: {e}"));
            return ExitCode::from(2);
        }
    };
    let format = config.log.format;
    crate::logs::init(silent, format);
    // The standard OTEL_* variables, read only by the command that exports.
    let telemetry = match &cli.command {
        Command::Work(_) => match crate::otel::ExportConfig::from_env().and_then(|c| {
            c.iter()
                .try_for_each(crate::otel::ExportConfig::check_files)?;
            Ok(c)
        }) {
            Ok(telemetry) => telemetry,
            Err(e) => {
                fatal(format, &format!("outboxd: telemetry: {e}"));
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.worker.threads > 0 {
        runtime.worker_threads(config.worker.threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            fatal(
                format,
                &format!("outboxd: cannot start the async runtime: {e}"),
            );
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(dispatch(&cli, config, provenance, telemetry));
    // Dropping the runtime would wait for every blocking task, however
    // long (a name lookup that hangs): the work is done, so the exit is
    // held up for a second at most.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal(format, &format!("outboxd: {}", error_line(&e)));
            exit_code(&e)
        }
    }
}

/// The line that ends the process, in the log format asked for: log
/// collectors read stderr as JSON lines, the last one too.
fn fatal(format: LogFormat, line: &str) {
    match format {
        LogFormat::Text => crate::complain!("{line}"),
        LogFormat::Json => tracing::error!("{line}"),
    }
}

/// The log format asked for, read as far as a configuration that was
/// refused allows: `OUTBOXD_LOG__FORMAT`, else the file's `[log] format`,
/// else text — so that the line saying why the configuration is refused is
/// JSON too when JSON was asked for.
fn log_format_asked(cli: &Cli) -> LogFormat {
    let parse = |s: &str| match s.trim() {
        "json" => Some(LogFormat::Json),
        "text" => Some(LogFormat::Text),
        _ => None,
    };
    if let Some(format) = std::env::var("OUTBOXD_LOG__FORMAT")
        .ok()
        .as_deref()
        .and_then(parse)
    {
        return format;
    }
    config_file(cli)
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| text.parse::<toml::Table>().ok())
        .and_then(|t| t.get("log")?.get("format")?.as_str().and_then(parse))
        .unwrap_or_default()
}

/// The exit code contract (docs/troubleshooting.md): 1 a runtime failure
/// that a later start may get past; 2 a usage or configuration problem
/// (one found only against the database included); 3 a refusal no restart
/// gets past — the database refused the login, or its schema is newer than
/// this binary. The packaged unit restarts on 1 only.
fn exit_code(e: &anyhow::Error) -> ExitCode {
    use crate::store::StoreError;
    use crate::worker::WorkError;
    fn store_error<'e>(c: &'e (dyn std::error::Error + 'static)) -> Option<&'e StoreError> {
        c.downcast_ref::<StoreError>()
            .or(match c.downcast_ref::<WorkError>() {
                Some(WorkError::Store(s)) => Some(s),
                _ => None,
            })
    }
    let config_problem = e.chain().any(|c| {
        matches!(store_error(c), Some(StoreError::Config(_)))
            || matches!(c.downcast_ref::<WorkError>(), Some(WorkError::Config(_)))
            || c.downcast_ref::<ConfigError>().is_some()
    });
    if config_problem {
        return ExitCode::from(2);
    }
    if e.chain()
        .any(|c| store_error(c).is_some_and(StoreError::is_permanent))
    {
        return ExitCode::from(3);
    }
    ExitCode::FAILURE
}

/// clap's error as one line: what is wrong, the arguments it names (a
/// missing one is on a line of its own) and its tip ("a similar subcommand
/// exists"), without the usage block.
fn usage_line(rendered: &str) -> String {
    let said: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let line = said.join(" ");
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    if line.is_empty() {
        "invalid arguments".into()
    } else {
        line.replace(": tip:", "; tip:")
            .replace(" tip: ", "; tip: ")
    }
}

/// An error and its causes as one line, each cause said once: a cause
/// whose text the line already holds is skipped, and PostgreSQL's source
/// positions (`at line 412` of the server's C code) are left out.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = without_server_positions(&cause.to_string());
        let text = text
            .strip_prefix("error returned from database: ")
            .unwrap_or(&text);
        if line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line
}

/// Removes every ` at line N` (sqlx appends PostgreSQL's source line).
fn without_server_positions(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(" at line ") {
        let after = &rest[i + " at line ".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        out.push_str(&rest[..i]);
        if digits == 0 {
            out.push_str(" at line ");
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out.replace("error returned from database: ", "")
}

/// The configuration file read: `--config`, else `config/outboxd.toml`
/// when there is one.
fn config_file(cli: &Cli) -> Option<PathBuf> {
    let default_path = PathBuf::from("config/outboxd.toml");
    match &cli.config {
        Some(path) => Some(path.clone()),
        None if default_path.is_file() => Some(default_path),
        None => None,
    }
}

/// Defaults < file < environment < flags, then validation; and where each
/// value came from.
pub fn load_config(cli: &Cli) -> Result<(Config, Provenance), ConfigError> {
    let file = config_file(cli);
    let (mut config, mut provenance) = Config::load(file.as_deref())?;
    let mut flag = |key: &str, flag: &'static str| provenance.set(key, Source::Flag(flag));
    if let Some(url) = &cli.database_url {
        config.database.url = url.clone();
        flag("database.url", "--database-url");
    }
    if let Some(url) = &cli.amqp_url {
        config.amqp.url = url.clone();
        flag("amqp.url", "--amqp-url");
    }
    if let Command::Work(WorkArgs {
        batch_size: Some(n),
        ..
    }) = &cli.command
    {
        config.outbox.batch_size = *n;
        flag("outbox.batch_size", "--batch-size");
    }
    let listen = match &cli.command {
        Command::Work(WorkArgs { ui: Some(addr), .. }) => Some((addr, "--ui")),
        Command::Ui { listen: Some(addr) } => Some((addr, "--listen")),
        _ => None,
    };
    if let Some((addr, name)) = listen {
        config.dashboard.listen = *addr;
        flag("dashboard.listen", name);
    }
    config.validate()?;
    if cli.command.uses_broker() {
        config.validate_broker()?;
    }
    Ok((config, provenance))
}

/// The configuration a command runs with: `config` shows every source,
/// `work` serves every source (one with `--source`), every other command
/// acts on one source — the one `--source` names, or the only one.
fn scoped(cli: &Cli, mut config: Config) -> Result<Config, ConfigError> {
    let every_source = match &cli.command {
        Command::Migrate { all_sources } => *all_sources,
        Command::Status(args) => args.all_sources,
        _ => false,
    };
    if every_source && cli.source.is_some() {
        return Err(ConfigError::Env(
            "--all-sources and --source: give one of them".into(),
        ));
    }
    match (&cli.command, cli.source.as_deref()) {
        _ if every_source => Ok(config),
        (Command::Config, _) | (Command::Work(_), None) => Ok(config),
        // The one source, kept as an entry: `repartition` names its stream
        // producers after it (`crate::ops::repartition`).
        (Command::Repartition(_), name) if !config.source.is_empty() => {
            config.for_source(name)?;
            if let Some(name) = name {
                config.source.retain(|s| s.name == name);
            }
            Ok(config)
        }
        // Several sources, none named: the all-sources dashboard.
        (Command::Ui { .. }, None) if config.source.len() > 1 => Ok(config),
        (Command::Work(_), Some(name)) if !config.source.is_empty() => {
            config.for_source(Some(name))?;
            config.source.retain(|s| s.name == name);
            Ok(config)
        }
        (_, name) => config.for_source(name),
    }
}

async fn dispatch(
    cli: &Cli,
    config: Config,
    provenance: Provenance,
    telemetry: Option<crate::otel::ExportConfig>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let command = cli.command.clone();
    match command {
        Command::Migrate { all_sources: false } => migrate(&config).await,
        Command::Migrate { all_sources: true } => {
            for source in config.sources()? {
                crate::say!("source {}:", source.name);
                migrate(&source.config)
                    .await
                    .with_context(|| format!("source {}", source.name))?;
            }
            Ok(())
        }
        Command::Work(args) => work(cli, &config, &args, telemetry).await,
        Command::Ui { .. } if config.source.len() > 1 => {
            let listener = crate::dashboard::bind(config.dashboard.listen).await?;
            let cancel = shutdown_on_signals();
            let all = crate::dashboard::sources::Sources::connect(&config, cancel.clone()).await?;
            let app = crate::dashboard::sources::router(all.clone());
            crate::dashboard::serve_router(listener, app, &all.home, cancel).await?;
            Ok(())
        }
        Command::Ui { .. } => {
            let store = Store::connect(
                &crate::store::StoreSettings::from_config(&config),
                "outboxd ui",
            )
            .await?;
            schema::check(&*store, Partitioner::new(config.outbox.partition_count)).await?;
            let listener = crate::dashboard::bind(config.dashboard.listen).await?;
            let state = crate::dashboard::DashboardState::new(&config, store, None);
            crate::dashboard::serve(listener, state, shutdown_on_signals()).await?;
            Ok(())
        }
        Command::Status(args) if args.all_sources => status_all_sources(&config, &args).await,
        Command::Status(args) => crate::ops::status(&config, &args).await,
        Command::Purge(args) => crate::ops::purge(&config, &args).await,
        Command::Repartition(args) => crate::ops::repartition(&config, &args).await,
        Command::Failed { command } => crate::ops::failed(&config, &command).await,
        Command::Streams { command } => crate::stream::declare::run(&config, &command).await,
        Command::Produce(args) => demo::produce(&config, &args, shutdown_on_signals())
            .await
            .context("produce"),
        Command::Consume(args) => demo::consume(&config, &args, shutdown_on_signals())
            .await
            .context("consume"),
        Command::Partition { keys } => {
            let p = Partitioner::new(config.outbox.partition_count);
            for key in keys {
                crate::say!("{}\t{key}", p.label_for(&key));
            }
            Ok(())
        }
        Command::Config => print_config(&config, &provenance),
    }
}

/// `outboxd work`: one source, or every `[[source]]` with reloads.
async fn work(
    cli: &Cli,
    config: &Config,
    args: &WorkArgs,
    telemetry: Option<crate::otel::ExportConfig>,
) -> anyhow::Result<()> {
    let opts = worker::WorkOptions {
        no_leasing: args.no_leasing,
        once: args.once,
        json: args.json,
        silent: args.silent,
        interval: Duration::from_millis(args.interval_ms),
        window: Duration::from_secs(args.window),
        ui: args.ui.is_some(),
        telemetry,
        source: None,
        board: None,
    };
    let cancel = shutdown_on_signals();
    if config.source.is_empty() {
        ignore_hangups();
        if config.worker.reload_on_change {
            tracing::warn!(
                "worker.reload_on_change: a configuration without [[source]] entries is not reloaded; restart the worker to apply changes"
            );
        }
        worker::run(config, &opts, cancel).await?;
    } else {
        let watched = config
            .worker
            .reload_on_change
            .then(|| config_file(cli))
            .flatten();
        let cli = cli.clone();
        let reload = Box::new(move || {
            let (config, _) = load_config(&cli)?;
            scoped(&cli, config)
        });
        worker::sources::run(config, &opts, cancel, reload, watched).await?;
    }
    Ok(())
}

/// `outboxd status --all-sources`: every source in turn; one that cannot be
/// read is said in its place (an `error` in `--json`), and the exit is 1.
async fn status_all_sources(config: &Config, args: &crate::ops::StatusArgs) -> anyhow::Result<()> {
    if args.json {
        let (mut all, mut failed) = (serde_json::Map::new(), Vec::new());
        for source in config.sources()? {
            let value = match crate::ops::summary(&source.config).await {
                Ok(summary) => serde_json::to_value(summary)?,
                Err(e) => {
                    failed.push(source.name.clone());
                    serde_json::json!({ "error": error_line(&e) })
                }
            };
            all.insert(source.name, value);
        }
        crate::say!("{}", serde_json::to_string_pretty(&all)?);
        return unread(&failed);
    }
    let mut failed = Vec::new();
    for source in config.sources()? {
        crate::say!("== source {} ==", source.name);
        if let Err(e) = crate::ops::status(&source.config, args).await {
            crate::say!("cannot read it: {}", error_line(&e));
            failed.push(source.name);
        }
        crate::say!();
    }
    unread(&failed)
}

/// `outboxd config`: the effective configuration, redacted, each value
/// with where it came from.
fn print_config(config: &Config, provenance: &Provenance) -> anyhow::Result<()> {
    use anyhow::Context;
    let text =
        toml::to_string(&redacted(config)).context("cannot print the configuration as TOML")?;
    let file = match &provenance.file {
        Some(path) => format!("read {path}"),
        None => "no file read".to_string(),
    };
    let variables = match provenance.variables() {
        v if v.is_empty() => "none".to_string(),
        v => v.join(", "),
    };
    // Each source's, named when there are `[[source]]` entries.
    let named = !config.source.is_empty();
    let cautions: String = config
        .sources()
        .unwrap_or_default()
        .iter()
        .flat_map(|s| {
            let source = named.then(|| format!("source {}: ", s.name));
            s.config
                .cautions()
                .into_iter()
                .map(move |c| format!("\n# caution: {}{c}", source.as_deref().unwrap_or("")))
        })
        .collect();
    crate::say!(
        "# outboxd: the effective configuration (defaults < file < environment < flags),\n\
         # passwords and the dashboard token redacted. Valid as a config file once the\n\
         # redacted secrets are filled in. Each value says where it came from.\n\
         # Configuration file: {file}. Variables used: {variables}.{cautions}\n\n{}",
        with_sources(&text, provenance).trim_end()
    );
    Ok(())
}

/// The error of `status --all-sources` when some sources could not be read.
fn unread(failed: &[String]) -> anyhow::Result<()> {
    match failed {
        [] => Ok(()),
        names => anyhow::bail!("could not read source(s) {}", names.join(", ")),
    }
}

/// `outboxd migrate` of one source's database.
async fn migrate(config: &Config) -> anyhow::Result<()> {
    let partitioner = Partitioner::new(config.outbox.partition_count);
    let store = Store::connect_for_session(
        &crate::store::StoreSettings::from_config(config),
        "outboxd migrate",
    )
    .await?;
    let report = store.migrate(partitioner).await?;
    for index in &report.rebuilt {
        crate::say!("rebuilt index {index}, which an interrupted build had left invalid");
    }
    crate::say!(
        "schema at version {} ({} migration(s) applied); partition_count {}{}",
        report.version,
        report.applied,
        partitioner.count(),
        if report.partition_count_recorded {
            " recorded"
        } else {
            ""
        }
    );
    Ok(())
}

/// The TOML text of a configuration with each key's source after it
/// (`batch_size = 500  # environment (OUTBOXD_OUTBOX__BATCH_SIZE)`).
fn with_sources(text: &str, provenance: &Provenance) -> String {
    let mut section = String::new();
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            out.push_str(line);
        } else if let Some((key, _)) = trimmed.split_once(" = ") {
            let dotted = if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            };
            // `[[source]]` entries (and their tables) come from the file only.
            let from = if section.starts_with("[source") || section.starts_with("source.") {
                "file".to_string()
            } else {
                provenance.source(&dotted).to_string()
            };
            out.push_str(&format!("{line}  # {from}"));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// `c` with every secret replaced by `***`.
fn redacted(c: &Config) -> Config {
    let mut c = c.clone();
    c.database.url = Redacted(&c.database.url).to_string();
    c.amqp.url = Redacted(&c.amqp.url).to_string();
    if !c.amqp.stream_url.is_empty() {
        c.amqp.stream_url = Redacted(&c.amqp.stream_url).to_string();
    }
    if !c.database.listen_url.is_empty() {
        c.database.listen_url = Redacted(&c.database.listen_url).to_string();
    }
    if !c.dashboard.token.is_empty() {
        c.dashboard.token = "***".into();
    }
    for s in &mut c.source {
        s.url = Redacted(&s.url).to_string();
        if !s.listen_url.is_empty() {
            s.listen_url = Redacted(&s.listen_url).to_string();
        }
        for (section, key) in [
            ("database", "listen_url"),
            ("database", "url"),
            ("amqp", "url"),
            ("amqp", "stream_url"),
        ] {
            let table = if section == "amqp" {
                &mut s.amqp
            } else {
                &mut s.database
            };
            if let Some(toml::Value::String(url)) = table.get_mut(key) {
                *url = Redacted(url).to_string();
            }
        }
    }
    c
}

/// SIGHUP reloads the sources of a worker with `[[source]]` entries; a
/// worker without says so instead of dying of it (the default action).
fn ignore_hangups() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut hup) = signal(SignalKind::hangup()) {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::warn!(
                        "SIGHUP: a configuration without [[source]] entries is not reloaded; restart the worker to apply changes"
                    );
                }
            });
        }
    }
}

/// A token cancelled by SIGTERM or Ctrl-C; a second signal exits at once.
fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        t.cancel();
        wait_for_signal().await;
        crate::complain!("outboxd: second signal, exiting immediately");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("database error while reading: {source}")]
    struct Wrapper {
        source: Inner,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("error returned from database: prepared statement \"s1\" already exists at line 412")]
    struct Inner;

    #[test]
    fn an_error_line_says_each_cause_once_without_server_positions() {
        let e = anyhow::Error::new(Wrapper { source: Inner });
        assert_eq!(
            error_line(&e),
            "database error while reading: prepared statement \"s1\" already exists"
        );
        let e = anyhow::anyhow!("connection refused").context("cannot connect to RabbitMQ");
        assert_eq!(
            error_line(&e),
            "cannot connect to RabbitMQ: connection refused"
        );
        assert_eq!(
            without_server_positions("a at line 3: b at line x"),
            "a: b at line x"
        );
    }
}

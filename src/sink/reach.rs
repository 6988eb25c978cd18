//! Whether a sink's broker can be reached ([`Reach`]), as each link last
//! saw it, and one view over several links.
//!
//! Each link a sink holds (the AMQP connection, the stream port) keeps its
//! own [`Reach`] in a [`watch`] channel: reachable when its last attempt
//! to connect succeeded, unreachable from the first failure after that.
//! A worker that cannot publish through one of them cannot drain a bucket
//! whose head goes there, so the sink reports the worst of its links
//! ([`Reach::worst`], kept current by [`follow_worst`]): the fleet
//! coordinator steps aside on it (G5), the probes and the report say it.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Whether the broker could be reached, as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Not reached since the process started: no attempt has succeeded
    /// yet (`error` is the last attempt's, if one failed).
    Never {
        error: Option<String>,
    },
    Reachable,
    /// Every attempt since `since` failed (or the connection was lost then).
    Unreachable {
        since: tokio::time::Instant,
        error: String,
    },
}

impl Reach {
    /// How long the broker has been unreachable (zero while reachable;
    /// for ever when it was never reached).
    pub fn unreachable_for(&self) -> Duration {
        match self {
            Reach::Never { .. } => Duration::MAX,
            Reach::Reachable => Duration::ZERO,
            Reach::Unreachable { since, .. } => since.elapsed(),
        }
    }

    /// The worse of two links' reach: never reached before unreachable
    /// (the longer unreachable first) before reachable. `b`'s error is
    /// prefixed with `b_name` when it is the one kept.
    pub fn worst(a: &Reach, b: &Reach, b_name: &str) -> Reach {
        let named = |r: &Reach| match r {
            Reach::Never { error } => Reach::Never {
                error: error.as_ref().map(|e| format!("{b_name}: {e}")),
            },
            Reach::Unreachable { since, error } => Reach::Unreachable {
                since: *since,
                error: format!("{b_name}: {error}"),
            },
            Reach::Reachable => Reach::Reachable,
        };
        match (a, b) {
            (Reach::Never { error: Some(_) }, _) | (Reach::Never { .. }, Reach::Reachable) => {
                a.clone()
            }
            (_, Reach::Never { .. }) => named(b),
            (Reach::Never { .. }, _) => a.clone(),
            (Reach::Unreachable { since: x, .. }, Reach::Unreachable { since: y, .. }) => {
                if y < x {
                    named(b)
                } else {
                    a.clone()
                }
            }
            (Reach::Unreachable { .. }, Reach::Reachable) => a.clone(),
            (Reach::Reachable, _) => named(b),
        }
    }
}

/// Records a failure to reach the broker; the first one since it was last
/// reachable starts the clock.
pub fn mark_unreachable(reach: &watch::Sender<Reach>, error: &str) {
    reach.send_modify(|r| match r {
        Reach::Reachable => {
            *r = Reach::Unreachable {
                since: tokio::time::Instant::now(),
                error: error.to_string(),
            }
        }
        Reach::Never { error: last } => *last = Some(error.to_string()),
        Reach::Unreachable { error: last, .. } => *last = error.to_string(),
    });
}

/// Records a successful connection; returns the reach it replaced when
/// that was not already reachable (the caller says so in its own words).
pub fn mark_reachable(reach: &watch::Sender<Reach>) -> Option<Reach> {
    let mut was = None;
    reach.send_if_modified(|r| {
        let before = std::mem::replace(r, Reach::Reachable);
        let changed = before != Reach::Reachable;
        was = changed.then_some(before);
        changed
    });
    was
}

/// Keeps `into` at the worst of `a` and `b` ([`Reach::worst`], `b`'s
/// errors named `b_name`) until `cancel` fires or both senders are gone.
pub async fn follow_worst(
    mut a: watch::Receiver<Reach>,
    mut b: watch::Receiver<Reach>,
    b_name: &'static str,
    into: watch::Sender<Reach>,
    cancel: CancellationToken,
) {
    loop {
        let worst = Reach::worst(&a.borrow_and_update(), &b.borrow_and_update(), b_name);
        into.send_if_modified(|r| std::mem::replace(r, worst.clone()) != worst);
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = a.changed() => if changed.is_err() { return },
            changed = b.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down(ago: u64, error: &str) -> Reach {
        Reach::Unreachable {
            since: tokio::time::Instant::now() - Duration::from_secs(ago),
            error: error.into(),
        }
    }

    #[tokio::test]
    async fn the_worst_link_is_the_one_reported_and_named() {
        let up = Reach::Reachable;
        assert_eq!(Reach::worst(&up, &up, "s"), up);
        let a = down(5, "amqp");
        assert_eq!(Reach::worst(&a, &up, "s"), a);
        let b = Reach::worst(&up, &down(5, "port"), "stream port");
        assert!(matches!(&b, Reach::Unreachable { error, .. } if error == "stream port: port"));
        // The longer unreachable of the two.
        let older = Reach::worst(&down(1, "amqp"), &down(9, "port"), "s");
        assert!(matches!(&older, Reach::Unreachable { error, .. } if error == "s: port"));
        let older = Reach::worst(&down(9, "amqp"), &down(1, "port"), "s");
        assert!(matches!(&older, Reach::Unreachable { error, .. } if error == "amqp"));
        // Never reached beats everything; an error beats none.
        let never = Reach::Never { error: None };
        assert_eq!(Reach::worst(&never, &up, "s"), never);
        assert_eq!(Reach::worst(&up, &never, "s"), Reach::Never { error: None });
        let refused = Reach::Never {
            error: Some("refused".into()),
        };
        assert_eq!(
            Reach::worst(&never, &refused, "s"),
            Reach::Never {
                error: Some("s: refused".into())
            }
        );
        assert_eq!(Reach::worst(&a, &never, "s"), never);
    }

    #[tokio::test]
    async fn a_follower_tracks_both_links() {
        let (a, ar) = watch::channel(Reach::Reachable);
        let (b, br) = watch::channel(Reach::Never { error: None });
        let (into, mut seen) = watch::channel(Reach::Never { error: None });
        let cancel = CancellationToken::new();
        let task = tokio::spawn(follow_worst(ar, br, "stream port", into, cancel.clone()));
        mark_reachable(&b);
        seen.wait_for(|r| *r == Reach::Reachable).await.unwrap();
        mark_unreachable(&b, "reset");
        seen.wait_for(
            |r| matches!(r, Reach::Unreachable { error, .. } if error == "stream port: reset"),
        )
        .await
        .unwrap();
        mark_reachable(&b);
        seen.wait_for(|r| *r == Reach::Reachable).await.unwrap();
        mark_unreachable(&a, "lost");
        seen.wait_for(|r| matches!(r, Reach::Unreachable { error, .. } if error == "lost"))
            .await
            .unwrap();
        cancel.cancel();
        task.await.unwrap();
    }
}

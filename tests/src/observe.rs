//! What lockkit reports, seen by the calling thread only: a `metrics` recorder
//! and a `tracing` subscriber installed for one closure. Tests running in parallel
//! on other threads cannot touch what these record, so counts are exact.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};

/// `tracing` caches, per callsite, whether any subscriber wants its events. A
/// callsite first reached on a thread without a subscriber, while none was
/// installed anywhere, would be cached as "never" and stay silent for the local
/// subscribers installed later (a race between parallel tests). A global
/// subscriber that wants nothing but answers "sometimes" for every callsite keeps
/// each one asking the subscriber of the current thread.
fn keep_every_callsite_asking() {
    struct AskEveryTime;
    impl Subscriber for AskEveryTime {
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            false
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Fails only if the test binary installed a global subscriber itself.
        let _ = tracing::subscriber::set_global_default(AskEveryTime);
        tracing::callsite::rebuild_interest_cache();
    });
}

/// One `tracing` event: its level and fields, values formatted with `Debug`
/// (strings without quotes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `WARN`, `INFO`, ...
    pub level: tracing::Level,
    /// Field name to value; the message is under `message`.
    pub fields: BTreeMap<String, String>,
}

impl Seen {
    /// The event's message.
    pub fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }

    /// A field's value.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Everything reported while [`observe`] ran its closure.
#[derive(Debug, Default)]
pub struct Observed {
    counters: BTreeMap<String, u64>,
    histograms: BTreeMap<String, Vec<f64>>,
    /// The `tracing` events of target `lockkit`, in order.
    pub events: Vec<Seen>,
}

impl Observed {
    /// A counter's total; `key` is the name with its labels, e.g.
    /// `lockkit_lock_errors_total{kind=busy}` (labels in the order given).
    pub fn counter(&self, key: &str) -> u64 {
        self.counters.get(key).copied().unwrap_or(0)
    }

    /// The values recorded in a histogram (same key format).
    pub fn histogram(&self, key: &str) -> &[f64] {
        self.histograms.get(key).map_or(&[], Vec::as_slice)
    }

    /// The events with this message.
    pub fn events_named(&self, message: &str) -> Vec<&Seen> {
        self.events
            .iter()
            .filter(|e| e.message() == message)
            .collect()
    }
}

/// Runs `f` with a metrics recorder and a tracing subscriber local to this thread.
pub fn observe<T>(f: impl FnOnce() -> T) -> (T, Observed) {
    keep_every_callsite_asking();
    let recorder = LocalRecorder::default();
    let subscriber = LocalSubscriber::default();
    let events = subscriber.events.clone();
    let out = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, f)
    });
    let counters = recorder
        .counters
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
        .collect();
    let histograms = recorder
        .histograms
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.0.lock().unwrap().clone()))
        .collect();
    let events = events.lock().unwrap().clone();
    (
        out,
        Observed {
            counters,
            histograms,
            events,
        },
    )
}

fn key_name(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

#[derive(Default)]
struct Values(Mutex<Vec<f64>>);

impl metrics::HistogramFn for Values {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

#[derive(Default)]
struct LocalRecorder {
    counters: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<BTreeMap<String, Arc<Values>>>,
}

impl Recorder for LocalRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        Counter::from_arc(counters.entry(key_name(key)).or_default().clone())
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut histograms = self.histograms.lock().unwrap();
        Histogram::from_arc(histograms.entry(key_name(key)).or_default().clone())
    }
}

#[derive(Default)]
struct LocalSubscriber {
    events: Arc<Mutex<Vec<Seen>>>,
    next_span: AtomicU64,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for LocalSubscriber {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "lockkit"
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().unwrap().push(Seen {
            level: *event.metadata().level(),
            fields,
        });
    }

    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

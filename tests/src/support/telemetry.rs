//! OpenTelemetry SDK providers over in-memory exporters, and flat views of what they hold, so a
//! test asserts measurements and spans as plain values.

use std::collections::BTreeMap;

use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, Sampler, SdkTracerProvider, SpanData};

/// A meter provider whose measurements a test reads back ([`Metrics::points`]).
pub struct Metrics {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

/// One data point of one instrument, flattened.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The instrument's name.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// Its description.
    pub description: String,
    /// The point's attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// What it measured.
    pub value: Value,
}

/// A data point's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter's running sum.
    Sum(f64),
    /// A gauge's last value.
    Gauge(f64),
    /// A histogram's count, sum, and bucket boundaries.
    Histogram {
        /// Measurements.
        count: u64,
        /// Their sum.
        sum: f64,
        /// The bucket boundaries.
        bounds: Vec<f64>,
    },
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A provider with cumulative temporality over an in-memory exporter.
    pub fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Self { provider, exporter }
    }

    /// A meter under chatter's scope name.
    pub fn meter(&self) -> Meter {
        self.provider.meter(chatter_runtime::telemetry::METER_NAME)
    }

    /// Every data point measured so far (the latest cumulative export).
    pub fn points(&self) -> Vec<Point> {
        self.exporter.reset();
        self.provider.force_flush().expect("metrics flush");
        let exported = self.exporter.get_finished_metrics().expect("metrics");
        let mut points = Vec::new();
        for resource in exported.iter().rev().take(1) {
            for scope in resource.scope_metrics() {
                for metric in scope.metrics() {
                    let point = |attributes: BTreeMap<String, String>, value| Point {
                        name: metric.name().to_owned(),
                        unit: metric.unit().to_owned(),
                        description: metric.description().to_owned(),
                        attributes,
                        value,
                    };
                    match metric.data() {
                        AggregatedMetrics::U64(data) => {
                            flatten(data, |v| v as f64, &mut |a, v| points.push(point(a, v)))
                        }
                        AggregatedMetrics::F64(data) => {
                            flatten(data, |v| v, &mut |a, v| points.push(point(a, v)))
                        }
                        AggregatedMetrics::I64(data) => {
                            flatten(data, |v| v as f64, &mut |a, v| points.push(point(a, v)))
                        }
                    }
                }
            }
        }
        points
    }

    /// The points of instrument `name`.
    pub fn of(&self, name: &str) -> Vec<Point> {
        self.points()
            .into_iter()
            .filter(|p| p.name == name)
            .collect()
    }
}

fn attributes<'a>(
    attributes: impl Iterator<Item = &'a opentelemetry::KeyValue>,
) -> BTreeMap<String, String> {
    attributes
        .map(|kv| (kv.key.to_string(), kv.value.to_string()))
        .collect()
}

fn flatten<T: Copy>(
    data: &MetricData<T>,
    as_f64: impl Fn(T) -> f64,
    push: &mut dyn FnMut(BTreeMap<String, String>, Value),
) {
    match data {
        MetricData::Sum(sum) => {
            for p in sum.data_points() {
                push(attributes(p.attributes()), Value::Sum(as_f64(p.value())));
            }
        }
        MetricData::Gauge(gauge) => {
            for p in gauge.data_points() {
                push(attributes(p.attributes()), Value::Gauge(as_f64(p.value())));
            }
        }
        MetricData::Histogram(histogram) => {
            for p in histogram.data_points() {
                push(
                    attributes(p.attributes()),
                    Value::Histogram {
                        count: p.count(),
                        sum: as_f64(p.sum()),
                        bounds: p.bounds().collect(),
                    },
                );
            }
        }
        MetricData::ExponentialHistogram(_) => {}
    }
}

impl Point {
    /// A counter's sum or a gauge's value; a histogram's count.
    pub fn number(&self) -> f64 {
        match &self.value {
            Value::Sum(v) | Value::Gauge(v) => *v,
            Value::Histogram { count, .. } => *count as f64,
        }
    }
}

/// A tracer provider whose finished spans a test reads back ([`Spans::finished`]).
pub struct Spans {
    provider: SdkTracerProvider,
    exporter: InMemorySpanExporter,
}

impl Default for Spans {
    fn default() -> Self {
        Self::new()
    }
}

impl Spans {
    /// Every span sampled.
    pub fn new() -> Self {
        Self::with_sampler(Sampler::AlwaysOn)
    }

    /// Spans sampled by `sampler`.
    pub fn with_sampler(sampler: Sampler) -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_sampler(sampler)
            .with_simple_exporter(exporter.clone())
            .build();
        Self { provider, exporter }
    }

    /// A tracer under chatter's scope name, boxed as the runtime holds it.
    pub fn tracer(&self) -> BoxedTracer {
        BoxedTracer::new(Box::new(
            self.provider
                .tracer(chatter_runtime::telemetry::TRACER_NAME),
        ))
    }

    /// The SDK provider (for a test's own spans).
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Every span ended so far.
    pub fn finished(&self) -> Vec<SpanData> {
        self.exporter.get_finished_spans().expect("spans")
    }

    /// The ended spans named `name`.
    pub fn named(&self, name: &str) -> Vec<SpanData> {
        self.finished()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }
}

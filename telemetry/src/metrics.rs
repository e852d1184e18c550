//! Metrics over OTLP: the SDK's periodic reader collects on a thread of
//! its own and hands each export to the export runtime, where the OTLP
//! exporter (tonic or hyper) can run.

use std::future::Future;
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use tokio::runtime::Handle;

/// A metric exporter whose exports run on `runtime`.
#[derive(Debug)]
pub(crate) struct OnRuntime<E> {
    pub(crate) inner: E,
    pub(crate) runtime: Handle,
}

impl<E: PushMetricExporter> PushMetricExporter for OnRuntime<E> {
    fn export(&self, metrics: &ResourceMetrics) -> impl Future<Output = OTelSdkResult> + Send {
        // Called on the reader's own thread (never a runtime's), which may
        // block: the export runtime's worker drives the I/O meanwhile.
        let result = self.runtime.block_on(self.inner.export(metrics));
        std::future::ready(result)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

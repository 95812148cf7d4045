//! NATS JetStream, driven from synchronous code: the relay's publishes with
//! their acks, the consumer's pull-and-ack, and the audit's counts.
//!
//! JetStream acknowledges every publish once the stream has stored the message
//! (the publisher confirm), and redelivers a consumed message that was not
//! acknowledged within the consumer's `ack_wait`. Messages carry their outbox
//! id in the `Outbox-Id` header, not in `Nats-Msg-Id`: JetStream would drop a
//! duplicate publish inside its deduplication window, which would hide the
//! duplicates this example exists to show (and a window is not a guarantee).

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream, AckKind};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use lockkit::outbox::OutboxMessage;
use tokio::runtime::Runtime;

use crate::OutboxError;

/// The header that carries the message id the consumer's inbox records.
pub const MESSAGE_ID_HEADER: &str = "Outbox-Id";

/// How long JetStream waits for a consumer's ack before it redelivers.
pub const ACK_WAIT: Duration = Duration::from_secs(1);

fn broker_error(e: impl std::fmt::Display) -> OutboxError {
    OutboxError::Broker(e.to_string())
}

/// A connection to the NATS server and its JetStream context.
pub struct Broker {
    runtime: Runtime,
    jetstream: jetstream::Context,
    stream: String,
}

/// One delivered message, as the consumer sees it.
#[derive(Debug)]
pub struct Delivery {
    /// The `Outbox-Id` header (empty when missing: the consumer rejects the
    /// message).
    pub message_id: String,
    /// The body.
    pub payload: Vec<u8>,
    /// How often JetStream has delivered it, this time included.
    pub delivered: i64,
    message: jetstream::Message,
}

impl Broker {
    /// Connects to `url` (e.g. `nats://127.0.0.1:4222`) for the stream `stream`.
    pub fn connect(url: &str, stream: &str) -> Result<Broker, OutboxError> {
        // One worker thread: the client's connection task keeps running (pings,
        // acks) while this thread is busy with the database.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(broker_error)?;
        let _entered = runtime.enter(); // the JetStream context spawns a task
        let client = runtime
            .block_on(async_nats::connect(url))
            .map_err(|e| OutboxError::Broker(format!("cannot reach NATS at {url}: {e}")))?;
        Ok(Broker {
            runtime,
            jetstream: jetstream::new(client),
            stream: stream.to_owned(),
        })
    }

    /// The subject the order service's messages go to.
    pub fn subject(stream: &str) -> String {
        format!("{stream}.created")
    }

    /// Deletes the stream if it exists and creates it empty, in memory or
    /// (`on_disk`) in files that outlive a restart of the server.
    pub fn reset_stream(&self, on_disk: bool) -> Result<(), OutboxError> {
        self.runtime.block_on(async {
            let _ = self.jetstream.delete_stream(&self.stream).await;
            self.jetstream
                .create_stream(stream::Config {
                    name: self.stream.clone(),
                    subjects: vec![format!("{}.>", self.stream)],
                    storage: if on_disk {
                        stream::StorageType::File
                    } else {
                        stream::StorageType::Memory
                    },
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(broker_error)
        })
    }

    /// Deletes the stream (the tests' cleanup).
    pub fn delete_stream(&self) -> Result<(), OutboxError> {
        self.runtime
            .block_on(self.jetstream.delete_stream(&self.stream))
            .map(drop)
            .map_err(broker_error)
    }

    /// How many messages the stream holds: every publish JetStream confirmed,
    /// duplicates included.
    pub fn stream_messages(&self) -> Result<u64, OutboxError> {
        self.runtime.block_on(async {
            let mut stream = self
                .jetstream
                .get_stream(&self.stream)
                .await
                .map_err(broker_error)?;
            Ok(stream.info().await.map_err(broker_error)?.state.messages)
        })
    }

    /// Publishes a batch and waits for JetStream's ack of each message: one
    /// outcome per message, in order, as `Relay::publish_batch` wants them.
    pub fn publish_confirmed(&self, batch: &[OutboxMessage]) -> Vec<Result<(), String>> {
        self.runtime.block_on(async {
            let mut pending = Vec::with_capacity(batch.len());
            for message in batch {
                let mut headers = HeaderMap::new();
                headers.insert(MESSAGE_ID_HEADER, message_id(message.id).as_str());
                let sent = self
                    .jetstream
                    .publish_with_headers(
                        message.topic.clone(),
                        headers,
                        message.payload.clone().into(),
                    )
                    .await;
                pending.push(sent);
            }
            // The acks are awaited together: each one's timeout starts when it
            // is awaited, and the relay waits inside the transaction that
            // claimed the batch (on SQLite, holding the database's write
            // lock), so one after the other a dead broker would cost the
            // batch one timeout per message.
            futures_util::future::join_all(pending.into_iter().map(|sent| async move {
                match sent {
                    Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }))
            .await
        })
    }

    /// The durable pull consumer `name`, explicit acks, redelivery after [`ACK_WAIT`].
    fn consumer(&self, name: &str) -> Result<jetstream::consumer::PullConsumer, OutboxError> {
        self.runtime.block_on(async {
            let stream = self
                .jetstream
                .get_stream(&self.stream)
                .await
                .map_err(broker_error)?;
            stream
                .get_or_create_consumer(
                    name,
                    pull::Config {
                        durable_name: Some(name.to_owned()),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: ACK_WAIT,
                        ..Default::default()
                    },
                )
                .await
                .map_err(broker_error)
        })
    }

    /// Pulls up to `max` messages for consumer `name`, waiting at most `wait`.
    pub fn fetch(
        &self,
        name: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, OutboxError> {
        let consumer = self.consumer(name)?;
        self.runtime.block_on(async {
            let mut messages = consumer
                .fetch()
                .max_messages(max)
                .expires(wait)
                .messages()
                .await
                .map_err(broker_error)?;
            let mut out = Vec::new();
            while let Some(message) = messages.next().await {
                let message = message.map_err(broker_error)?;
                let message_id = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(MESSAGE_ID_HEADER))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
                out.push(Delivery {
                    message_id,
                    payload: message.payload.to_vec(),
                    delivered,
                    message,
                });
            }
            Ok(out)
        })
    }

    /// Acknowledges a delivery and waits for JetStream to confirm the ack, so
    /// an ack that returned is never redelivered.
    pub fn ack(&self, delivery: &Delivery) -> Result<(), OutboxError> {
        self.runtime
            .block_on(delivery.message.double_ack())
            .map_err(broker_error)
    }

    /// Terminates a delivery that no delivery of could ever be applied (a
    /// poison message): JetStream stops redelivering it, and it no longer
    /// counts as pending. Waits for JetStream to confirm, as [`Broker::ack`].
    pub fn reject(&self, delivery: &Delivery) -> Result<(), OutboxError> {
        self.runtime
            .block_on(delivery.message.double_ack_with(AckKind::Term))
            .map_err(broker_error)
    }

    /// Hands a delivery back unapplied (a negative ack): JetStream delivers it
    /// again at once rather than after [`ACK_WAIT`]. Not confirmed: a lost one
    /// only means the redelivery waits for the ack wait.
    pub fn retry_later(&self, delivery: &Delivery) -> Result<(), OutboxError> {
        self.runtime
            .block_on(delivery.message.ack_with(AckKind::Nak(None)))
            .map_err(broker_error)
    }

    /// Whether consumer `name` has nothing left: no message undelivered and
    /// none delivered but unacknowledged.
    pub fn drained(&self, name: &str) -> Result<bool, OutboxError> {
        let mut consumer = self.consumer(name)?;
        self.runtime.block_on(async {
            let info = consumer.info().await.map_err(broker_error)?;
            Ok(info.num_pending == 0 && info.num_ack_pending == 0)
        })
    }
}

/// The id an outbox row travels under, and the inbox records.
pub fn message_id(outbox_id: i64) -> String {
    format!("order-service/{outbox_id}")
}

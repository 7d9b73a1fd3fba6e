//! Messages: ordering them, and acknowledging a retried id once.

use super::*;

/// A message to publish. Serializable: cluster mode puts it into a room's
/// shared log as it is.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct PublishParams {
    /// Channel.
    pub channel: String,
    /// Application event name.
    pub event: String,
    /// Raw JSON payload.
    pub data: Option<Box<serde_json::value::RawValue>>,
    /// Client message id for idempotency.
    pub id: Option<String>,
    /// Topic.
    pub topic: Option<String>,
    /// The seq this message answers.
    pub reply_to: Option<u64>,
    /// Deliver to the sender too.
    pub echo: bool,
}

/// The outcome of a publish.
#[derive(Debug)]
pub struct Published {
    /// The message's seq (the original one for a duplicate).
    pub seq: u64,
    /// The new event to deliver; `None` for a duplicate.
    pub entry: Option<Arc<HistoryEntry>>,
}

impl<S> Room<S> {
    /// Orders a message, or acknowledges a duplicate client message id again.
    pub fn publish(
        &mut self,
        session: &str,
        p: PublishParams,
        now: Millis,
    ) -> Result<Published, RoomError> {
        let (seq, window) = (self.seq, self.config.dedup_window);
        let m = self.connected_member(session)?;
        if p.channel.is_empty() || p.channel.len() > 64 {
            return Err(RoomError::new(
                ErrorCode::InvalidFrame,
                format!("channel names have 1 to 64 bytes: {:?}", p.channel),
            ));
        }
        if let Some(id) = &p.id {
            if let Some(&seq) = m.recent.as_ref().and_then(|r| r.seqs.get(id)) {
                return Ok(Published { seq, entry: None });
            }
        }
        if p.reply_to.is_some_and(|r| r == 0 || r > seq) {
            return Err(RoomError::new(
                ErrorCode::InvalidFrame,
                format!("reply_to must name an earlier seq (1..={seq})"),
            ));
        }
        if let Some(id) = p.id.as_ref().filter(|_| window > 0) {
            let recent = m.recent.get_or_insert_with(Default::default);
            if recent.order.len() >= window {
                if let Some(old) = recent.order.pop_front() {
                    recent.seqs.remove(&old);
                }
            }
            recent.seqs.insert(id.clone(), seq + 1);
            recent.order.push_back(id.clone());
        }
        let body = EventBody::Message {
            channel: p.channel.clone(),
            event: p.event,
            data: p.data,
            topic: p.topic.clone(),
            reply_to: p.reply_to,
            id: p.id,
        };
        let sender = if p.echo {
            SenderCopy::Live
        } else {
            SenderCopy::None
        };
        let entry = self.push_full(
            Some(session),
            Some(p.channel),
            sender,
            p.topic,
            p.reply_to,
            Scope::All,
            body,
            now,
        );
        Ok(Published {
            seq: entry.seq,
            entry: Some(entry),
        })
    }
}

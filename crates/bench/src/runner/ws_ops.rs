//! Publishes and requests over a user's WebSocket.

use super::user::{expand_json, UserState};
use super::*;

/// What a publish carries besides its send time and sender.
pub(super) enum Body<'a> {
    /// Padding up to about this many bytes in all.
    Padding(usize),
    /// A chat text.
    Text(&'a str),
}

pub(super) async fn publish(
    shared: &Arc<Shared>,
    st: &mut UserState,
    channel: Option<&str>,
    event: &str,
    body: Body<'_>,
) -> bool {
    let Some(j) = &st.joined else {
        shared.error("publish: not joined");
        return false;
    };
    let sent = unix_micros();
    let payload = match body {
        Body::Padding(bytes) => {
            let head = format!(r#"{{"bt":{sent},"vu":{},"p":""#, st.vu);
            let pad = bytes.saturating_sub(head.len() + 2);
            let mut payload = head;
            payload.extend(std::iter::repeat_n('x', pad));
            payload.push_str("\"}");
            payload
        }
        Body::Text(text) => serde_json::json!({"bt": sent, "vu": st.vu, "text": text}).to_string(),
    };
    st.out.clear();
    shared
        .opts
        .driver
        .publish(&j.room, channel, event, &payload, &mut st.out);
    let len = st.out.len() as u64;
    shared.ws_sending();
    if let Err(e) = j.writer.lock().await.send_text(st.out.as_bytes()).await {
        shared.error(format!("publish: {}", e.kind()));
        return false;
    }
    let room = st.room_index as usize;
    // Members subscribed to the channel, and whether the publisher is one.
    let (subscribers, subscribed) = match channel {
        None | Some("main") => (shared.room_sizes[room], true),
        Some(ch) => (
            shared.channel_sizes[room].get(ch).copied().unwrap_or(0),
            j.channels.iter().any(|c| c == ch),
        ),
    };
    let recipients = if subscribed && !shared.opts.driver.echoes_sender() {
        subscribers.saturating_sub(1)
    } else {
        subscribers
    };
    shared
        .counts
        .publishes_total
        .fetch_add(1, Ordering::Relaxed);
    shared
        .counts
        .expected_total
        .fetch_add(recipients, Ordering::Relaxed);
    if shared.recording() {
        shared.counts.publishes.fetch_add(1, Ordering::Relaxed);
        shared
            .counts
            .expected
            .fetch_add(recipients, Ordering::Relaxed);
        shared.counts.bytes_out.fetch_add(len, Ordering::Relaxed);
    }
    shared.webhook_expect(channel);
    true
}

pub(super) async fn request(
    shared: &Arc<Shared>,
    st: &mut UserState,
    op: &str,
    args: Option<&serde_json::Value>,
) -> bool {
    let Some(j) = &st.joined else {
        shared.error("request: not joined");
        return false;
    };
    let nonce = shared.next_nonce.fetch_add(1, Ordering::Relaxed);
    let args = args.cloned().unwrap_or(serde_json::json!({}));
    let args = expand_json(args, st.vu, st.room_index, &st.flow, &mut st.rng);
    st.out.clear();
    if !shared
        .opts
        .driver
        .request(&j.room, nonce, op, &args, &mut st.out)
    {
        shared.error(format!(
            "request: {} has no requests",
            shared.opts.driver.name()
        ));
        return false;
    }
    let (tx, rx) = oneshot::channel();
    shared
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(nonce, tx);
    shared.ws_sending();
    let sent = Instant::now();
    if let Err(e) = j.writer.lock().await.send_text(st.out.as_bytes()).await {
        shared.error(format!("request: {}", e.kind()));
        return false;
    }
    let answer = tokio::select! {
        _ = shared.ending.cancelled() => return false,
        a = tokio::time::timeout(shared.opts.timeout, rx) => a,
    };
    let rt = sent.elapsed();
    match answer {
        Ok(Ok(ok)) => {
            if ok {
                shared.counts.requests_ok.fetch_add(1, Ordering::Relaxed);
            } else {
                shared
                    .counts
                    .requests_failed
                    .fetch_add(1, Ordering::Relaxed);
                shared.error(format!("request {op}: refused"));
            }
            if shared.recording() {
                let _ = shared
                    .request_rt
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .record((rt.as_micros() as u64).max(1));
            }
            true
        }
        _ => {
            shared
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&nonce);
            shared
                .counts
                .requests_failed
                .fetch_add(1, Ordering::Relaxed);
            shared.error(format!("request {op}: no response"));
            true
        }
    }
}

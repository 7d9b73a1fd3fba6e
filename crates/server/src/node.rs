//! The node: its rooms, its ticket store, its metrics and its shutdown signal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plaza_broker::{Cluster, TicketStore};
use plaza_core::RoomError;
use plaza_protocol::CloseCode;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::directory::{CreateRoom, RoomDirectory, RoomList, RoomSummary};
use crate::metrics::NodeMetrics;
use crate::outbox::ConnectionControl;
use crate::room::{Intent, RoomCommand, RoomHandle};
use crate::status::Status;
use crate::webhooks::{WebhookEvent, WebhookKind, Webhooks};
use crate::ServerConfig;

/// One Plaza node.
pub struct Node {
    config: ServerConfig,
    tickets: Arc<dyn TicketStore>,
    /// Where rooms are: in this process, or in the cluster's registry.
    rooms: RoomDirectory,
    pub(crate) metrics: NodeMetrics,
    shutdown: CancellationToken,
    /// The open sessions' controls, by id: shutdown closes each. (A
    /// session does not watch the shutdown token itself: polling a token
    /// takes its lock, and a busy connection polls on every wake-up.)
    sessions: std::sync::Mutex<HashMap<u64, std::sync::Weak<ConnectionControl>>>,
    connections: AtomicUsize,
    connections_changed: Notify,
    /// Open HTTP transport sessions (SSE, long polling).
    pub(crate) http_sessions: crate::transport::http::HttpSessions,
    /// Joins per client address (`max_joins_per_ip_per_sec`; `None`: no limit).
    join_rate: Option<std::sync::Mutex<plaza_core::RatePerKey<std::net::IpAddr>>>,
    /// Token checks; `None` in development mode (no `jwt_*` key).
    tokens: Option<Arc<crate::auth::TokenVerifier>>,
    /// Webhook targets; `None` without any (emitting is then skipped).
    webhooks: Option<Arc<Webhooks>>,
}

impl Node {
    /// An embedded-mode node with no rooms.
    pub fn new(config: ServerConfig, tickets: Arc<dyn TicketStore>) -> Arc<Node> {
        Node::build(config, tickets, None)
    }

    /// A cluster-mode node: rooms live in `cluster`, shared with other nodes.
    pub fn clustered(
        config: ServerConfig,
        tickets: Arc<dyn TicketStore>,
        cluster: Arc<dyn Cluster>,
    ) -> Arc<Node> {
        Node::build(config, tickets, Some(cluster))
    }

    fn build(
        mut config: ServerConfig,
        tickets: Arc<dyn TicketStore>,
        cluster: Option<Arc<dyn Cluster>>,
    ) -> Arc<Node> {
        if let Some(c) = &cluster {
            config.node_id = c.node_id().to_owned();
        } else if config.node_id.is_empty() {
            config.node_id = format!("n-{}", plaza_broker::new_session_id());
        }
        let metrics = NodeMetrics::new();
        let webhooks = match &cluster {
            Some(c) => Webhooks::clustered(&config.webhooks, &metrics, c.clone()),
            None => Webhooks::new(&config.webhooks, &metrics),
        };
        let rooms = match cluster {
            Some(c) => RoomDirectory::cluster(&config, &metrics, c, webhooks.clone()),
            None => RoomDirectory::local(&config, &metrics, webhooks.clone()),
        };
        // About 65,536 addresses are kept; idle ones are forgotten first.
        let join_rate = (config.max_joins_per_ip_per_sec > 0).then(|| {
            let rate = config.max_joins_per_ip_per_sec;
            std::sync::Mutex::new(plaza_core::RatePerKey::new(rate, rate, 65_536))
        });
        let tokens = match crate::auth::TokenVerifier::from_config(&config) {
            Ok(v) => v.map(Arc::new),
            Err(e) => {
                // Keys were asked for: fail closed, never open.
                tracing::error!(error = %e, "token keys do not load: every token is refused");
                Some(Arc::new(crate::auth::TokenVerifier::refusing_all()))
            }
        };
        if let Some(v) = &tokens {
            crate::auth::spawn_jwks_watch(
                v,
                metrics.jwks_reloads.clone(),
                metrics.jwks_reload_failures.clone(),
            );
        }
        Arc::new(Node {
            tokens,
            webhooks,
            config,
            tickets,
            rooms,
            metrics,
            shutdown: CancellationToken::new(),
            sessions: std::sync::Mutex::new(HashMap::new()),
            connections: AtomicUsize::new(0),
            connections_changed: Notify::new(),
            http_sessions: Default::default(),
            join_rate,
        })
    }

    /// Whether a client at `ip` may join now (`max_joins_per_ip_per_sec`).
    pub(crate) fn may_join_from(&self, ip: std::net::IpAddr, now: plaza_core::Millis) -> bool {
        match &self.join_rate {
            None => true,
            Some(rate) => rate
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .try_take(ip, now),
        }
    }

    /// The webhook targets, if any.
    pub(crate) fn webhooks(&self) -> Option<&Arc<Webhooks>> {
        self.webhooks.as_ref()
    }

    /// The webhook targets that want events of type `kind`, if any.
    fn webhooks_for(&self, kind: WebhookKind) -> Option<&Arc<Webhooks>> {
        self.webhooks().filter(|w| w.wants(kind, None))
    }

    /// Token checks, unless in development mode.
    pub(crate) fn tokens(&self) -> Option<&crate::auth::TokenVerifier> {
        self.tokens.as_deref()
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.config.node_id
    }

    /// Where tickets are kept (this process, or Redis shared by the cluster).
    pub fn tickets(&self) -> &Arc<dyn TicketStore> {
        &self.tickets
    }

    /// The name of what the node shares state through: `memory` or `redis`.
    pub fn broker_kind(&self) -> &'static str {
        self.tickets.kind()
    }

    /// Prometheus text of this node's metrics.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// What this node is doing now (`GET /v1/status`). Rates and latency come
    /// from the samples [`serve`](crate::serve) takes once a second; a node
    /// served otherwise reports them as zero and `null`.
    pub fn status(&self) -> Status {
        Status::new(
            self.id().to_owned(),
            self.broker_kind(),
            self.connection_count(),
            self.hosted_rooms(),
            self.serves_demo_tokens(),
            self.metrics.snapshot(),
        )
    }

    /// Whether `POST /v1/demo/token` is served: `demo_tokens`, with the
    /// `jwt_secret` it signs with.
    pub(crate) fn serves_demo_tokens(&self) -> bool {
        self.config().demo_tokens && !self.config().jwt_secret.is_empty()
    }

    /// Starts shutdown: stop accepting, tell clients to reconnect.
    pub fn shutdown(&self) {
        // Under the sessions' lock: a session opened meanwhile is either
        // closed here or sees the token cancelled when it registers.
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        self.shutdown.cancel();
        for control in sessions.values().filter_map(std::sync::Weak::upgrade) {
            control.close(CloseCode::Restarting);
        }
    }

    /// Registers an open session's control, for [`Node::shutdown`] to close.
    pub(crate) fn session_opened(&self, control: &Arc<ConnectionControl>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if self.shutdown.is_cancelled() {
            control.close(CloseCode::Restarting);
        }
        sessions.insert(control.id(), Arc::downgrade(control));
    }

    /// Forgets a session registered with [`Node::session_opened`].
    pub(crate) fn session_closed(&self, control: &ConnectionControl) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&control.id());
    }

    /// Whether shutdown has started.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Open WebSocket connections.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    pub(crate) fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::AcqRel);
        self.metrics.connections.increment(1.0);
    }

    pub(crate) fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::AcqRel);
        self.metrics.connections.decrement(1.0);
        self.connections_changed.notify_waiters();
    }

    pub(crate) async fn wait_connections_closed(&self, grace: Duration) {
        let wait = async {
            loop {
                let changed = self.connections_changed.notified();
                if self.connection_count() == 0 {
                    return;
                }
                changed.await;
            }
        };
        if tokio::time::timeout(grace, wait).await.is_err() {
            tracing::warn!(
                left = self.connection_count(),
                "shutdown grace over, dropping connections"
            );
        }
    }

    /// The cluster, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        self.rooms.shared()
    }

    /// Creates a room: in embedded mode it starts its task; in cluster mode
    /// it enters the shared registry (nodes host it when members join).
    /// Emits `room.created` (id `{room}:created:{created_at}`, data the
    /// summary but its id).
    pub async fn create_room(&self, spec: CreateRoom) -> Result<RoomSummary, RoomError> {
        let summary = self.rooms.create(spec).await?;
        if let Some(hooks) = self.webhooks_for(WebhookKind::RoomCreated) {
            let mut data = serde_json::to_value(&summary).unwrap_or_default();
            if let Some(o) = data.as_object_mut() {
                o.remove("id");
            }
            hooks.emit(WebhookEvent {
                id: format!("{}:created:{}", summary.id, summary.created_at),
                kind: WebhookKind::RoomCreated,
                room: summary.id.clone(),
                channel: None,
                timestamp_ms: summary.created_at,
                data,
            });
        }
        Ok(summary)
    }

    /// The handle of the room a connection joins (see [`RoomDirectory::room_for_join`]).
    pub(crate) async fn room_for_join(&self, id: &str) -> Result<RoomHandle, RoomError> {
        self.rooms.room_for_join(id).await
    }

    /// The handle of an existing room, never creating one (a join that may
    /// only resume a session, see `connection::admission`).
    pub(crate) async fn existing_room(&self, id: &str) -> Result<RoomHandle, RoomError> {
        self.rooms.existing(id).await
    }

    /// Hands `cmd` to room `id`'s task. In cluster mode the task found may
    /// be a replica that just stopped hosting: its mailbox closed before
    /// `cmd` was queued, so the command was never seen and goes to the
    /// room's next replica (found again, a few times at most). A room that
    /// is gone answers `room_not_found`.
    async fn send_to_room(&self, id: &str, mut cmd: RoomCommand) -> Result<(), RoomError> {
        for _ in 0..3 {
            match self.existing_room(id).await?.send(cmd).await {
                Ok(()) => return Ok(()),
                Err(unsent) => cmd = unsent,
            }
        }
        Err(crate::room::answer::room_deleted(id))
    }

    /// A server API change to room `id` (see [`Intent`]), and its JSON answer.
    pub(crate) async fn room_call(
        &self,
        id: &str,
        intent: Intent,
    ) -> Result<serde_json::Value, RoomError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let cmd = RoomCommand::client(intent, crate::room::Pending::server(reply));
        self.send_to_room(id, cmd).await?;
        answer
            .await
            .unwrap_or_else(|_| Err(crate::room::answer::room_deleted(id)))
    }

    /// Runs `look` on room `id`'s task and gives back what it returns.
    pub(crate) async fn read_room<T: Send + 'static>(
        &self,
        id: &str,
        look: impl FnOnce(&plaza_core::Room<crate::room::Sink>) -> T + Send + 'static,
    ) -> Result<T, RoomError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let cmd = RoomCommand::Read(Box::new(move |room| {
            let _ = reply.send(look(room));
        }));
        self.send_to_room(id, cmd).await?;
        answer
            .await
            .map_err(|_| crate::room::answer::room_deleted(id))
    }

    /// Whether this node holds room `id` now.
    pub(crate) fn hosts(&self, id: &str) -> bool {
        self.rooms.held_handles().iter().any(|h| h.id() == id)
    }

    /// The handles of the rooms held here.
    pub(crate) fn held_rooms(&self) -> Vec<RoomHandle> {
        self.rooms.held_handles()
    }

    /// Rooms held here: every room in embedded mode, the hosted ones in cluster mode.
    pub fn hosted_rooms(&self) -> usize {
        self.rooms.held()
    }

    /// Every room, ordered by id. In cluster mode, `members` is exact for
    /// rooms this node hosts; for the others it is the count their hosts
    /// recorded last (a moment old).
    ///
    /// On a Redis Cluster with a shard that has no primary, the rooms that
    /// cannot be read are left out and [`RoomList::complete`] is false.
    pub async fn list_rooms(&self) -> Result<RoomList, RoomError> {
        self.rooms.list().await
    }

    /// One room.
    pub async fn room_summary(&self, id: &str) -> Result<Option<RoomSummary>, RoomError> {
        self.rooms.summary(id).await
    }

    /// Removes member `session` from `room` for good: it gets `closed`
    /// (reason `kicked`, with `message`), the others its `presence.leave`.
    /// `session_not_found` when there is no such session, `room_not_found`
    /// when there is no such room.
    pub async fn kick(
        &self,
        room: &str,
        session: &str,
        message: Option<String>,
    ) -> Result<(), RoomError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let kick = Intent::Kick {
            session: session.to_owned(),
            message,
        };
        let cmd = RoomCommand::client(kick, crate::room::Pending::admin(reply));
        self.send_to_room(room, cmd).await?;
        answer
            .await
            .unwrap_or_else(|_| Err(crate::room::answer::room_deleted(room)))
    }

    /// The connected members of `room`, ordered by session id.
    pub async fn room_members(
        &self,
        room: &str,
    ) -> Result<Vec<plaza_protocol::server::MemberInfo>, RoomError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.send_to_room(room, RoomCommand::Members { reply })
            .await?;
        answer
            .await
            .map_err(|_| crate::room::answer::room_deleted(room))
    }

    /// Deletes a room: its members (on every node) get a `closed` frame.
    /// False if it did not exist.
    /// Emits `room.deleted` (id `{room}:deleted:{unix ms}`).
    pub async fn delete_room(&self, id: &str) -> Result<bool, RoomError> {
        let deleted = self.rooms.delete(id).await?;
        if let Some(hooks) = self
            .webhooks_for(WebhookKind::RoomDeleted)
            .filter(|_| deleted)
        {
            let now = crate::clock::now_ms();
            hooks.emit(WebhookEvent {
                id: format!("{id}:deleted:{now}"),
                kind: WebhookKind::RoomDeleted,
                room: id.to_owned(),
                channel: None,
                timestamp_ms: now,
                data: serde_json::Value::Null,
            });
        }
        Ok(deleted)
    }
}

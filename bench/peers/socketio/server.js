// Socket.IO peer for `plaza bench --driver socketio` (crates/bench/src/driver/socketio.rs).
// Two events, matching the driver exactly:
//   42["join", room]  -> join that room (the driver sends no ack id; one is answered if given)
//   42["msg", data]   -> relay `data` as "msg" to every room the sender joined, sender excluded
// Run: PORT=3000 node server.js

"use strict";

const http = require("node:http");
const { Server } = require("socket.io");

const PORT = Number(process.env.PORT || 3000);
const HOST = "127.0.0.1"; // loopback only: this is a benchmark peer, not a service

const httpServer = http.createServer();
const io = new Server(httpServer, {
  // The driver opens a WebSocket straight away (no long-polling start), so
  // polling is disabled rather than left as an unused code path.
  transports: ["websocket"],
  // No browser clients: don't serve /socket.io/socket.io.js.
  serveClient: false,
  // Compression would cost CPU the other peers don't spend; the driver
  // doesn't negotiate it either.
  perMessageDeflate: false,
});

io.on("connection", (socket) => {
  socket.on("join", (room, ack) => {
    socket.join(room);
    if (typeof ack === "function") ack({ ok: true });
  });

  socket.on("msg", (data) => {
    // socket.rooms always holds the socket's own id room; skip it so the
    // sender does not receive its own message (the driver expects no echo).
    for (const r of socket.rooms) {
      if (r !== socket.id) socket.to(r).emit("msg", data);
    }
  });
});

httpServer.listen(PORT, HOST, () => {
  console.log(`listening on ${HOST}:${PORT}`);
});

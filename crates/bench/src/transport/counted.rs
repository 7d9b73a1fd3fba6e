//! A stream that counts the bytes read and written through it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::SocketTally;

/// `inner`, with every byte that passes through counted in `tally`.
pub struct Counted<S> {
    inner: S,
    tally: Option<Arc<SocketTally>>,
}

impl<S> Counted<S> {
    /// Counts `inner`'s traffic in `tally` (`None`: counts nothing).
    pub fn new(inner: S, tally: Option<Arc<SocketTally>>) -> Counted<S> {
        Counted { inner, tally }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(t)) = (&polled, &self.tally) {
            t.add_read(buf.filled().len() - before);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(t)) = (&polled, &self.tally) {
            t.add_written(*n);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(t)) = (&polled, &self.tally) {
            t.add_written(*n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_both_ways_are_counted() {
        let (a, mut b) = tokio::io::duplex(64);
        let tally = Arc::new(SocketTally::default());
        let mut a = Counted::new(a, Some(tally.clone()));
        a.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        b.write_all(b"hi").await.unwrap();
        let mut back = [0u8; 2];
        a.read_exact(&mut back).await.unwrap();
        assert_eq!((&got, &back), (b"hello", b"hi"));
        assert_eq!(tally.load(), (2, 5, 0));
    }
}

//! Connections the server can cut from outside: once a connection's token is cancelled its reads and
//! writes fail, which makes the HTTP server drop it and close the socket, even while it waits for a
//! client that does not read (hyper would never poll the response body then).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The cut switch of one connection, handed to the requests it carries.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionCut(pub(crate) CancellationToken);

impl Connected<IncomingStream<'_, CuttableListener>> for ConnectionCut {
    fn connect_info(stream: IncomingStream<'_, CuttableListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// A TCP listener whose connections are [`CuttableStream`]s.
pub(crate) struct CuttableListener(pub(crate) TcpListener);

impl Listener for CuttableListener {
    type Io = CuttableStream;
    type Addr = ConnectionCut;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, _)) => {
                    let cut = CancellationToken::new();
                    let cancelled = Box::pin(cut.clone().cancelled_owned());
                    return (CuttableStream { inner: stream, cancelled }, ConnectionCut(cut));
                }
                // Out of file descriptors and the like: try again shortly, as axum's own listener does.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(ConnectionCut(CancellationToken::new()))
    }
}

/// A TCP stream that fails once cut.
pub(crate) struct CuttableStream {
    inner: TcpStream,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl CuttableStream {
    /// Also registers the task to be woken by the cut.
    fn cut(&mut self, cx: &mut Context<'_>) -> bool {
        self.cancelled.as_mut().poll(cx).is_ready()
    }
}

fn reset() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "connection cut by the fan-out test server")
}

impl AsyncRead for CuttableStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.cut(cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CuttableStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.cut(cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.cut(cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

//! A local HTTP server on a free loopback port for tests: a stand-in AWS endpoint, a proxy, a sink.

use std::net::SocketAddr;

use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An axum router served on 127.0.0.1 at a free port; stops when dropped.
pub struct LocalServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl LocalServer {
    /// Serves `app` until dropped.
    pub async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// GET `path` from `address` (`host:port`) over plain HTTP/1.1: (status, body); `None` when there is
/// no answer (nothing listening yet, a broken response), for tests that wait for a server.
pub async fn try_http_get(address: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_string()))
}

/// [`try_http_get`] of a server that must answer.
pub async fn http_get(address: &str, path: &str) -> (u16, String) {
    try_http_get(address, path).await.unwrap_or_else(|| panic!("no HTTP answer from {address}{path}"))
}

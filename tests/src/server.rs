//! A local HTTP server on a free loopback port for tests: a stand-in AWS endpoint, a proxy, a sink.

use std::net::SocketAddr;

use axum::Router;

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

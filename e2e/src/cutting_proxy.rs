//! A TCP proxy in front of kube-apiserver that cuts, when told, every connection open through
//! it: a client's watches break while its new requests (writes, relists) still reach the API
//! server, which a restart of the API server cannot do. TLS passes through untouched: the client
//! still verifies the API server's certificate, which is valid for 127.0.0.1 whatever the port.

use std::net::{Ipv4Addr, SocketAddr};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

use crate::error::{Error, Result};

/// The proxy; dropping it closes every connection through it.
#[derive(Debug)]
pub struct CuttingProxy {
    address: SocketAddr,
    cuts: watch::Sender<u64>,
    accepting: JoinHandle<()>,
}

impl CuttingProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`, the API
    /// server's URL (`https://127.0.0.1:6443`).
    pub async fn start(upstream: &str) -> Result<Self> {
        let target = upstream
            .strip_prefix("https://")
            .unwrap_or(upstream)
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(Error::io("binding the cutting proxy"))?;
        let address = listener
            .local_addr()
            .map_err(Error::io("reading the cutting proxy's address"))?;
        let (cuts, _) = watch::channel(0_u64);
        let accepting = tokio::spawn(forward(listener, target, cuts.clone()));
        Ok(Self {
            address,
            cuts,
            accepting,
        })
    }

    /// The URL to give a client instead of the API server's.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// Closes every connection open through the proxy now; later ones are served.
    pub fn cut(&self) {
        self.cuts.send_modify(|cuts| *cuts += 1);
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.cut();
    }
}

/// Accepts connections and copies each to and from `target` until the next cut.
async fn forward(listener: TcpListener, target: String, cuts: watch::Sender<u64>) {
    while let Ok((mut client, _)) = listener.accept().await {
        // Subscribed now: only cuts from here on close this connection.
        let mut cut = cuts.subscribe();
        let target = target.clone();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(&target).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = cut.changed() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn echo(stream: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        stream.write_all(b"ping").await?;
        let mut answer = [0_u8; 4];
        stream.read_exact(&mut answer).await?;
        Ok(answer)
    }

    #[tokio::test]
    async fn a_cut_closes_open_connections_and_new_ones_are_served() {
        let upstream = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let upstream_url = format!("https://{}", upstream.local_addr().unwrap());
        // An echo server.
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = upstream.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        let proxy = CuttingProxy::start(&upstream_url).await.unwrap();
        let address = proxy.url().trim_start_matches("https://").to_owned();
        let mut before = TcpStream::connect(&address).await.unwrap();
        assert_eq!(&echo(&mut before).await.unwrap(), b"ping");
        proxy.cut();
        let mut rest = Vec::new();
        assert_eq!(before.read_to_end(&mut rest).await.unwrap(), 0, "closed");
        let mut after = TcpStream::connect(&address).await.unwrap();
        assert_eq!(&echo(&mut after).await.unwrap(), b"ping");
    }
}

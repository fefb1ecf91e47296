//! [`NetWatch`]: the links and routes, dumped in their own task after every kernel
//! notification.

use tokio::sync::watch;

use crate::model::links::{Link, Route};
use crate::net::netlink::{self, InterfaceWatch};

/// The latest links and routes, dumped in the background after every kernel notification.
#[derive(Debug)]
pub struct NetWatch {
    rx: watch::Receiver<(Vec<Link>, Vec<Route>)>,
    task: tokio::task::JoinHandle<()>,
}

impl NetWatch {
    /// Subscribes, then dumps once (no change between the two is missed).
    pub async fn start() -> Result<(NetWatch, Vec<Link>, Vec<Route>), netlink::Error> {
        let mut watch_kernel = InterfaceWatch::subscribe()?;
        let (links, routes) = netlink::snapshot().await?;
        let (tx, rx) = watch::channel((links.clone(), routes.clone()));
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = watch_kernel.changed().await {
                    tracing::warn!(error = %e, "link and route notifications stopped: subscribing again");
                    match InterfaceWatch::subscribe() {
                        Ok(w) => watch_kernel = w,
                        Err(e) => {
                            tracing::error!(error = %e, "interface changes are no longer seen");
                            return;
                        }
                    }
                }
                match netlink::snapshot().await {
                    Ok(net) => {
                        if tx.send(net).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read links and routes"),
                }
            }
        });
        Ok((NetWatch { rx, task }, links, routes))
    }

    /// The links and routes last dumped.
    pub fn latest(&self) -> (Vec<Link>, Vec<Route>) {
        self.rx.borrow().clone()
    }

    /// Another view of the links and routes last dumped (for a reader that does not wait for
    /// changes).
    pub fn subscribe(&self) -> watch::Receiver<(Vec<Link>, Vec<Route>)> {
        self.rx.clone()
    }

    /// Resolves with the next links and routes.
    pub async fn changed(&mut self) -> Option<(Vec<Link>, Vec<Route>)> {
        self.rx.changed().await.ok()?;
        Some(self.rx.borrow_and_update().clone())
    }
}

impl Drop for NetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

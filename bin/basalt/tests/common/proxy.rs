//! A TCP proxy that can be cut: put it between one process and a server (a gateway and etcd) to
//! cut that process off while others keep talking to the server directly.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Whether the proxy is cut, and every socket it opened (to shut them down when it is).
#[derive(Default)]
struct State {
    cut: bool,
    sockets: Vec<TcpStream>,
}

/// Forwards every connection to `target` until [`Proxy::cut`] (or drop): then every connection
/// is closed, and new ones are closed at once.
pub struct Proxy {
    /// `127.0.0.1:PORT`, chosen by the OS.
    pub addr: String,
    state: Arc<Mutex<State>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    pub fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let acceptor = {
            let (state, target) = (state.clone(), target.to_string());
            std::thread::spawn(move || accept(listener, &target, &state))
        };
        Proxy {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.cut = true;
        for s in state.sockets.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        // Wake the acceptor so that it sees the cut and ends.
        let _ = TcpStream::connect(&self.addr);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn accept(listener: TcpListener, target: &str, state: &Mutex<State>) {
    for client in listener.incoming() {
        if state.lock().unwrap().cut {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(target) else {
            continue;
        };
        let mut state = state.lock().unwrap();
        if state.cut {
            return;
        }
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
            std::thread::spawn(move || pump(from, to));
        }
        state.sockets.push(client);
        state.sockets.push(server);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 65536];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

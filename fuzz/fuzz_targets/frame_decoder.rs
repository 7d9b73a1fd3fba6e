//! Every client frame goes through `decode`, then the checks a frame's
//! fields get before any room sees it: none may panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plaza_protocol::client::{decode, ClientFrame};

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = decode(data) else {
        return;
    };
    match frame {
        ClientFrame::Request(r) => {
            let _ = r.op();
        }
        ClientFrame::Join(j) => {
            if let Some(p) = &j.policy {
                let _ = p.validate();
            }
            if let Some(h) = &j.history {
                let _ = h.validate();
            }
        }
        _ => {}
    }
});

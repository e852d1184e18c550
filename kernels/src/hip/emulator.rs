//! Test support: the HIP kernels' own source, built as host C++ with
//! `-DBH_EMULATE` (`kernels/hip/emulate/`), running in a child process that
//! holds the "device memory". It checks the kernels' logic and the host code
//! that drives them on machines without a GPU, at any wave size; it says
//! nothing about device speed, memory ordering or the device math library
//! (host libm stands in). Blocks run one after another on a single CPU
//! thread, each GPU thread a fiber switched at barriers: tens of
//! nanoseconds per emulated thread and barrier on x86-64 (ten times that
//! elsewhere, through `<ucontext.h>`) on top of the kernels' own arithmetic,
//! done serially: fit for tests and tiny models, not real ones.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use super::device::{DeviceError, KernelDevice};

/// The harness source, relative to this crate.
const HARNESS: &str = "hip/emulate/harness.cpp";

/// Why the emulator could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HarnessError {
    /// No C++ compiler could be started (`CXX`, g++ and clang++ are
    /// missing): the machine lacks one, and tests may skip for it.
    #[error("no C++ compiler to build the HIP kernel emulator with ({0})")]
    NoCompiler(String),
    /// A compiler ran and failed: a bug in the kernels' source (or a
    /// compiler without C++20), never a reason to skip.
    #[error("building the HIP kernel emulator failed: {0}")]
    Build(String),
}

/// Where the kernels' source (which the emulator is built from) was when
/// this crate was compiled.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hip")
}

/// Builds the emulator binary into `dir` with the first C++ compiler there
/// is (`CXX`, else g++, else clang++). A compiler that runs and fails is a
/// [`HarnessError::Build`] at once (the source is broken), not a reason to
/// try the next.
pub fn build_harness(dir: &Path) -> Result<PathBuf, HarnessError> {
    let hip_dir = source_dir();
    // Built under a name of this process's own, then renamed into place:
    // test binaries of several crates (or several cargo runs) share `dir`,
    // and one may be running the harness while another rebuilds it.
    let out = dir.join("bh-emulate");
    let building = dir.join(format!("bh-emulate.{}.tmp", std::process::id()));
    let compilers: Vec<String> = match std::env::var("CXX") {
        Ok(cxx) => vec![cxx],
        Err(_) => vec!["g++".into(), "clang++".into()],
    };
    let mut why = Vec::new();
    for cxx in compilers {
        let result = Command::new(&cxx)
            .args(["-std=c++20", "-O2", "-DBH_EMULATE", "-Wno-unknown-pragmas"])
            .arg("-I")
            .arg(&hip_dir)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(HARNESS))
            .arg("-o")
            .arg(&building)
            .output();
        match result {
            Ok(o) if o.status.success() => {
                return std::fs::rename(&building, &out)
                    .map(|()| out.clone())
                    .map_err(|e| {
                        HarnessError::Build(format!("placing it at {}: {e}", out.display()))
                    });
            }
            Ok(o) => {
                return Err(HarnessError::Build(format!(
                    "{cxx}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => why.push(format!("{cxx}: {e}")),
            Err(e) => return Err(HarnessError::Build(format!("starting {cxx}: {e}"))),
        }
    }
    Err(HarnessError::NoCompiler(why.join("; ")))
}

/// The emulated device: one child process, requests in order.
#[derive(Debug)]
pub struct Emulator {
    wave: u32,
    io: Mutex<Io>,
}

#[derive(Debug)]
struct Io {
    child: Child,
    input: BufWriter<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Emulator {
    /// Starts `harness` (from [`build_harness`]) as a device with `wave` threads per wave.
    pub fn start(harness: &Path, wave: u32) -> Result<Emulator, DeviceError> {
        let mut child = Command::new(harness)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| DeviceError::new(format!("start {}", harness.display()), e.to_string()))?;
        let input = BufWriter::new(child.stdin.take().expect("piped stdin"));
        let output = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(Emulator {
            wave,
            io: Mutex::new(Io {
                child,
                input,
                output,
            }),
        })
    }

    /// Sends one request and reads the reply's `reply_len` bytes.
    fn request(
        &self,
        what: &str,
        request: &[u8],
        reply_len: usize,
    ) -> Result<Vec<u8>, DeviceError> {
        // A broken pipe or a short reply: the process is gone or out of
        // step with us, so the device is lost.
        let gone = |e: std::io::Error| DeviceError::lost(what, format!("emulator gone: {e}"));
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        io.input
            .write_all(request)
            .and_then(|()| io.input.flush())
            .map_err(gone)?;
        let mut status = [0u8; 1];
        io.output.read_exact(&mut status).map_err(gone)?;
        if status[0] != 0 {
            let mut len = [0u8; 4];
            io.output.read_exact(&mut len).map_err(gone)?;
            let mut msg = vec![0u8; u32::from_le_bytes(len) as usize];
            io.output.read_exact(&mut msg).map_err(gone)?;
            return Err(DeviceError::new(
                what,
                String::from_utf8_lossy(&msg).into_owned(),
            ));
        }
        let mut reply = vec![0u8; reply_len];
        io.output.read_exact(&mut reply).map_err(gone)?;
        Ok(reply)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let io = self.io.get_mut().unwrap_or_else(|p| p.into_inner());
        // Closing stdin ends the child's loop; wait so no zombie is left.
        let _ = io.input.flush();
        let _ = io.child.kill();
        let _ = io.child.wait();
    }
}

impl KernelDevice for Emulator {
    fn describe(&self) -> String {
        format!("HIP kernel emulator (CPU threads, wave {})", self.wave)
    }

    fn wave_size(&self) -> u32 {
        self.wave
    }

    fn alloc(&self, bytes: usize) -> Result<u64, DeviceError> {
        let mut req = vec![b'A'];
        req.extend_from_slice(&(bytes as u64).to_le_bytes());
        let reply = self.request(&format!("alloc {bytes} bytes"), &req, 8)?;
        Ok(u64::from_le_bytes(reply.try_into().expect("8 bytes")))
    }

    fn free(&self, addr: u64) -> Result<(), DeviceError> {
        let mut req = vec![b'F'];
        req.extend_from_slice(&addr.to_le_bytes());
        self.request(&format!("free {addr:#x}"), &req, 0).map(drop)
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), DeviceError> {
        let mut req = Vec::with_capacity(17 + bytes.len());
        req.push(b'W');
        req.extend_from_slice(&addr.to_le_bytes());
        req.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        req.extend_from_slice(bytes);
        self.request(
            &format!("write {} bytes at {addr:#x}", bytes.len()),
            &req,
            0,
        )
        .map(drop)
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        let mut req = vec![b'R'];
        req.extend_from_slice(&addr.to_le_bytes());
        req.extend_from_slice(&(out.len() as u64).to_le_bytes());
        let reply = self.request(
            &format!("read {} bytes at {addr:#x}", out.len()),
            &req,
            out.len(),
        )?;
        out.copy_from_slice(&reply);
        Ok(())
    }

    fn launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        threads: u32,
        args: &[u8],
    ) -> Result<(), DeviceError> {
        let mut req = vec![b'L'];
        req.extend_from_slice(&(kernel.len() as u32).to_le_bytes());
        req.extend_from_slice(kernel.as_bytes());
        for v in [
            grid[0],
            grid[1],
            grid[2],
            threads,
            self.wave,
            args.len() as u32,
        ] {
            req.extend_from_slice(&v.to_le_bytes());
        }
        req.extend_from_slice(args);
        self.request(&format!("launch {kernel}"), &req, 0).map(drop)
    }
}

//! Test-only: corrupt resident weights the way a hardware fault or a stray
//! write would, to prove the scrub notices. Reachable only when the host was
//! started with `--enable-test-hooks`.

use std::os::unix::fs::FileExt;

/// Flips the lowest bit of `bytes[offset]` in place.
///
/// The write goes through `/proc/self/mem`, i.e. the kernel, as another
/// process's write to shared memory would: the weights stay read-only to
/// this process's code and no `unsafe` is needed. Readers may see either
/// value, which is exactly the fault being simulated.
pub fn flip_resident_bit(bytes: &[u8], offset: usize) -> std::io::Result<()> {
    let Some(&current) = bytes.get(offset) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("offset {offset} is past the end ({} bytes)", bytes.len()),
        ));
    };
    let address = bytes.as_ptr() as u64 + offset as u64;
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")?;
    mem.write_all_at(&[current ^ 0x01], address)
}

//! Python packages for the tests that drive a Python tool (the TLS tests' `websockets`, the
//! Kubernetes schema validator): a virtualenv made from a requirements file on first use, and
//! made again when that file changes (a stamp in the virtualenv holds the file it was made
//! from). Nothing is installed outside the virtualenv's directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python of the virtualenv `venv` holding `requirements` (pip), made now unless it
/// already holds exactly that file; `Err(why)` when it cannot be made here (no python3, no
/// network to the package index).
pub fn python(requirements: &Path, venv: &Path) -> Result<PathBuf, String> {
    let python = venv.join("bin/python");
    let stamp = venv.join(".requirements");
    let wanted =
        std::fs::read(requirements).map_err(|e| format!("{}: {e}", requirements.display()))?;
    if python.exists() && std::fs::read(&stamp).ok().as_deref() == Some(&wanted[..]) {
        return Ok(python);
    }
    eprintln!(
        "installing {} into {}",
        requirements.display(),
        venv.display()
    );
    let _ = std::fs::remove_dir_all(venv);
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(requirements))?;
    std::fs::write(&stamp, wanted).map_err(|e| e.to_string())?;
    Ok(python)
}

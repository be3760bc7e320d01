#!/usr/bin/env python3
"""The Debian package scripts/package builds, checked as a user would meet it (issue #19):

- dpkg-deb --info: name, version (project()'s), architecture, a Depends from dpkg-shlibdeps
  naming the real libraries, the conffiles, executable maintainer scripts that parse;
- dpkg-deb --contents: the binary, both units, the config (root only) and default file, the
  man page, all owned by root;
- dpkg-deb -x: the extracted binary prints the version and was built without fault points; the
  example config loads, with its commented examples enabled too, and a wrong key in it fails;
- each unit's ExecStart, expanded as systemd would (/etc/default/idemgate, %d), starts the
  extracted binary, answers /healthz and stops cleanly on SIGTERM; http without its upstream
  exits 2 (RestartPreventExitStatus=2);
- the man page renders with groff without a warning and names every command and its flags;
- the units differ only in Description= and ExecStart=; systemd-analyze verify passes on them
  (paths pointed into the extraction) and fails on a broken copy; systemd-analyze security
  --offline reports each unit's exposure (at most 2.0).

    package_test.py --deb build-package/idemgate_0.1.0_amd64.deb
"""
import argparse
import gzip
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = ("idemgate-serve.service", "idemgate-http.service")
MAX_EXPOSURE = 2.0
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def run(*argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def project_version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(idemgate VERSION ([0-9.]+)", text).group(1)


def control_fields(deb):
    info = run("dpkg-deb", "--field", deb).stdout
    fields, last = {}, None
    for line in info.splitlines():
        if line.startswith(" ") and last:
            fields[last] += "\n" + line
        else:
            last, _, value = line.partition(":")
            fields[last] = value.strip()
    return fields


def check_info(deb, version, tmp):
    fields = control_fields(deb)
    arch = run("dpkg", "--print-architecture").stdout.strip()
    name = os.path.basename(deb)
    check(name == f"idemgate_{version}_{arch}.deb", f"file name {name}")
    check(fields.get("Package") == "idemgate", f"Package: {fields.get('Package')}")
    check(fields.get("Version") == version, f"Version: {fields.get('Version')} (project {version})")
    check(fields.get("Architecture") == arch, f"Architecture: {fields.get('Architecture')}")
    for field in ("Maintainer", "Section", "Description"):
        value = fields.get(field, "")
        check(bool(value), f"{field}: {value.splitlines()[0] if value else ''}")
    depends = fields.get("Depends", "")
    print(f"     Depends: {depends}")
    for lib in ("libc6", "libstdc++6", "libssl3", "libsqlite3-0", "libhiredis", "libpq5",
                "libboost-json1.81.0", "libboost-url1.81.0", "libfmt9", "libjemalloc2"):
        check(re.search(rf"(^|, ){re.escape(lib)}", depends) is not None, f"Depends names {lib}")

    control = os.path.join(tmp, "control")
    subprocess.run(["dpkg-deb", "--control", deb, control], check=True)
    conffiles = open(os.path.join(control, "conffiles")).read().split()
    check(conffiles == ["/etc/idemgate/idemgate.toml", "/etc/default/idemgate"],
          f"conffiles: {conffiles}")
    for script in ("postinst", "prerm", "postrm"):
        path = os.path.join(control, script)
        check(os.access(path, os.X_OK) and run("sh", "-n", path).returncode == 0,
              f"{script} is executable and parses")


def check_contents(deb):
    listing = {}
    for line in run("dpkg-deb", "--contents", deb).stdout.splitlines():
        mode, owner, _size, _date, _time, path = line.split(None, 5)
        listing[path.split(" -> ")[0].removeprefix(".")] = (mode, owner)
    expected = {
        "/usr/bin/idemgate": "-rwxr-xr-x",
        "/usr/lib/systemd/system/idemgate-serve.service": "-rw-r--r--",
        "/usr/lib/systemd/system/idemgate-http.service": "-rw-r--r--",
        "/etc/idemgate/idemgate.toml": "-rw-------",
        "/etc/default/idemgate": "-rw-r--r--",
        "/usr/share/man/man1/idemgate.1.gz": "-rw-r--r--",
    }
    for path, mode in expected.items():
        got = listing.get(path, ("missing", ""))[0]
        check(got == mode, f"contents: {path} {got}")
    owners = {owner for _mode, owner in listing.values()}
    check(owners == {"root/root"}, f"every file owned by root/root ({', '.join(sorted(owners))})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_default_file(path):
    env = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def exec_start(unit_text, env, credentials, binary):
    """The unit's ExecStart= as systemd expands it: %d, ${VAR} one word, $VAR split."""
    line = next(l for l in unit_text.splitlines() if l.startswith("ExecStart="))
    argv = []
    for word in shlex.split(line[len("ExecStart="):].replace("%d", credentials)):
        if re.fullmatch(r"\$[A-Z_]+", word):
            argv += env.get(word[1:], "").split()
        else:
            argv.append(re.sub(r"\$\{([A-Z_]+)\}", lambda m: env.get(m.group(1), ""), word))
    check(argv[0] == "/usr/bin/idemgate", f"ExecStart runs /usr/bin/idemgate: {shlex.join(argv)}")
    return [binary] + argv[1:]


def check_units_run(x, tmp, binary):
    """Both units' commands, with the packaged config and default file, start and stop."""
    credentials = os.path.join(tmp, "credentials")
    os.makedirs(credentials)
    shutil.copy(os.path.join(x, "etc/idemgate/idemgate.toml"), credentials)
    store = "sqlite:" + os.path.join(tmp, "run.db")
    defaults = read_default_file(os.path.join(x, "etc/default/idemgate"))
    for unit in UNITS:
        text = open(os.path.join(x, "usr/lib/systemd/system", unit)).read()
        env = dict(defaults)
        port = free_port()
        listen = "IDEMGATE_SERVE_LISTEN" if "serve" in unit else "IDEMGATE_HTTP_LISTEN"
        env[listen] = f"127.0.0.1:{port}"
        if "http" in unit:
            # The default file ships without an upstream: the unit must not start, with exit 2.
            argv = exec_start(text, env, credentials, binary) + ["--store", store]
            r = run(*argv, timeout=30)
            said = (r.stderr.strip().splitlines() or [""])[0]
            check(r.returncode == 2 and "--upstream" in said,
                  f"{unit} without IDEMGATE_HTTP_UPSTREAM exits 2: {said}")
            env["IDEMGATE_HTTP_UPSTREAM"] = f"http://127.0.0.1:{free_port()}"
        argv = exec_start(text, env, credentials, binary) + ["--store", store]
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        healthy = False
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None and not healthy:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    healthy = r.status == 200
            except OSError:
                time.sleep(0.1)
        check(healthy, f"{unit}: its ExecStart answers /healthz on 127.0.0.1:{port}")
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        check(proc.returncode == 0 and "stopping on SIGTERM" in err,
              f"{unit}: SIGTERM stops it gracefully (exit {proc.returncode})")


def check_binary_and_config(x, tmp, version):
    binary = os.path.join(x, "usr/bin/idemgate")
    r = run(binary, "--version")
    check(r.returncode == 0 and r.stdout.strip() == f"idemgate {version}",
          f"usr/bin/idemgate --version: {r.stdout.strip()}")
    r = run(binary, "stats", "--store", "memory:",
            env={**os.environ, "IDEMGATE_FAULT_POINT": "after_claim"})
    check(r.returncode == 1 and "fault point" in r.stderr.lower(),
          f"built without fault points (refuses IDEMGATE_FAULT_POINT): {r.stderr.strip()}")
    sections = run("readelf", "-S", "-W", binary).stdout
    check(".text" in sections and ".symtab" not in sections, "binary stripped (no .symtab)")

    config = os.path.join(x, "etc/idemgate/idemgate.toml")
    text = open(config).read()
    check('store = "sqlite:/var/lib/idemgate/idemgate.db"' in text,
          "config: store in /var/lib/idemgate")
    store = "sqlite:" + os.path.join(tmp, "config.db")
    enabled = os.path.join(tmp, "enabled.toml")
    # Every commented key enabled, its placeholder tokens replaced as the operator must (idemgate
    # refuses a REPLACE-WITH-… token at start).
    enabled_text = re.sub(r"(?m)^#([a-z\[])", r"\1", text)
    enabled_text = re.sub(r"REPLACE-WITH-[A-Z-]*", lambda m: "t" + uuid.uuid4().hex, enabled_text)
    open(enabled, "w").write(enabled_text)
    broken = os.path.join(tmp, "broken.toml")
    open(broken, "w").write(text.replace("[defaults]\n", "[defaults]\nttll = \"1h\"\n"))
    for path, what in ((config, "as shipped"), (enabled, "with every #key = value enabled")):
        r = run(binary, "stats", "--config", path, "--store", store)
        check(r.returncode == 0,
              f"config loads {what} (idemgate stats --config): {r.stderr.strip()}")
    r = run(binary, "stats", "--config", broken, "--store", store)
    check(r.returncode == 1 and "ttll" in r.stderr, f"a wrong key in it fails: {r.stderr.strip()}")
    return binary


def help_commands(binary):
    text = run(binary, "--help").stdout
    section = text.split("Subcommands:", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in section.splitlines()
            if line.startswith("  ") and not line.startswith("   ")]


def check_man(x, binary):
    page = gzip.open(os.path.join(x, "usr/share/man/man1/idemgate.1.gz"), "rt").read()
    r = run("groff", "-man", "-Tutf8", "-ww", "-rLL=100n", input=page)
    check(r.returncode == 0 and not r.stderr.strip(),
          f"man page renders without warnings {r.stderr.strip()}")
    text = re.sub(r".\x08", "", r.stdout).replace("\u2010", "-").replace("\u2212", "-")
    commands = help_commands(binary)
    check(len(commands) >= 10, f"{len(commands)} commands in --help: {' '.join(commands)}")
    for command in commands:
        check(f"idemgate {command}" in text, f"man page has a section for idemgate {command}")
    for flag in ("--store", "--config", "--listen", "--upstream", "--drain-timeout",
                 "--insecure-no-auth", "--release", "--show-outcome"):
        check(flag in text, f"man page documents {flag}")
    for word in ("/etc/idemgate/idemgate.toml", "/etc/default/idemgate", "EXIT STATUS"):
        check(word in text, f"man page mentions {word}")


def analyze(*args, env=None):
    return run("systemd-analyze", *args, env=env)


def settings(unit_text):
    """A unit's settings, without comments and the lines that make it serve or http."""
    return [l for l in unit_text.splitlines()
            if l.strip() and not l.startswith(("#", "Description=", "ExecStart="))]


def check_systemd(x, tmp):
    texts = [open(os.path.join(x, "usr/lib/systemd/system", u)).read() for u in UNITS]
    check(settings(texts[0]) == settings(texts[1]),
          "both units have the same user, state directory, restart policy and hardening")
    units = os.path.join(tmp, "units")
    os.makedirs(units)
    for unit in UNITS:
        text = open(os.path.join(x, "usr/lib/systemd/system", unit)).read()
        for path in ("/usr/bin/idemgate", "/etc/idemgate/idemgate.toml", "/etc/default/idemgate"):
            text = text.replace(path, x + path)
        open(os.path.join(units, unit), "w").write(text)
    paths = [os.path.join(units, u) for u in UNITS]
    # Documentation=man:idemgate(1) is checked with man(1): the extracted page must be found.
    env = {**os.environ, "MANPATH": os.path.join(x, "usr/share/man")}
    r = analyze("verify", *paths, env=env)
    said = (r.stdout + r.stderr).strip()
    check(r.returncode == 0 and not said,
          f"systemd-analyze verify {' '.join(UNITS)}: rc {r.returncode} {said}")

    # The check must be able to fail: an unknown directive is reported, a missing binary fails.
    broken = os.path.join(tmp, "broken")
    os.makedirs(broken)
    text = open(paths[0]).read()
    b1 = os.path.join(broken, "idemgate-typo.service")
    open(b1, "w").write(text.replace("ProtectSystem=strict", "ProtectSytem=strict"))
    b2 = os.path.join(broken, "idemgate-nobinary.service")
    open(b2, "w").write(text.replace(x + "/usr/bin/idemgate", "/nonexistent/idemgate"))
    r = analyze("verify", b1, env=env)
    said = (r.stdout + r.stderr).strip()
    check("ProtectSytem" in said, f"verify reports a misspelled directive: {said}")
    r = analyze("verify", b2, env=env)
    said = (r.stdout + r.stderr).strip()
    check(r.returncode != 0, f"verify fails on a missing binary: rc {r.returncode} {said}")

    for path in paths:
        r = analyze("security", "--offline=yes", "--no-pager", path)
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\S+)", r.stdout + r.stderr)
        score = float(m.group(1)) if m else 99.0
        said = f"{m.group(1)} {m.group(2)}" if m else r.stderr.strip()
        check(score <= MAX_EXPOSURE,
              f"systemd-analyze security --offline {os.path.basename(path)}: {said}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--deb", required=True)
    a = p.parse_args()
    for tool in ("dpkg-deb", "groff", "systemd-analyze"):
        if not shutil.which(tool):
            sys.exit(f"package_test: {tool} not found: run scripts/setup")
    version = project_version()
    deb = os.path.abspath(a.deb)
    print(f"     {deb}: {os.path.getsize(deb)} bytes")
    with tempfile.TemporaryDirectory(prefix="idemgate-package-") as tmp:
        check_info(deb, version, tmp)
        check_contents(deb)
        x = os.path.join(tmp, "root")
        subprocess.run(["dpkg-deb", "-x", deb, x], check=True)
        binary = check_binary_and_config(x, tmp, version)
        check_units_run(x, tmp, binary)
        check_man(x, binary)
        check_systemd(x, tmp)
    if failures:
        print(f"package_test: {len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("package_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes idemgate(1) from the binary's own help: `idemgate --help`, then every command's
`--help`, so the man page cannot drift from the flags. Also writes OUTPUT.gz (gzip -9n: no
name, no time, the same bytes for the same help).

    manpage.py --binary build-package/idemgate --output build-package/packaging/idemgate.1

CLI11's help is: a description, "Usage: ...", sections ("Options:", "Positionals:",
"Subcommands:") of two-space-indented entries with the text in a column, then the footer.
"""
import argparse
import gzip
import re
import subprocess
import sys

SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")

# What the help does not say: the package's files, the environment, exit codes.
TRAILER = r"""
.SH EXIT STATUS
0 success, 1 failure (the message is on standard error), 2 usage error.
.SH ENVIRONMENT
.TP
.B XDG_STATE_HOME\fR, \fBHOME
The default store, without \fB\-\-store\fR or a config's \fBstore\fR:
\fIsqlite:$XDG_STATE_HOME/idemgate/idemgate.db\fR, else
\fIsqlite:~/.local/state/idemgate/idemgate.db\fR.
.TP
.B XDG_RUNTIME_DIR
The hook directory of \fBidemgate hook\fR and the \fBhook:turn\fR source of
\fBidemgate mcp\fR, without \fB[mcp] hook_dir\fR: \fI$XDG_RUNTIME_DIR/idemgate\fR, else
\fI/tmp/idemgate\-UID\fR (mode 0700; one \fIturn\-PID\-STARTTIME.json\fR per agent host process).
.SH FILES
.TP
.I /etc/idemgate/idemgate.toml
The services' config (TOML; every key and its default are in README.md, "Configuration").
Readable by root only; the units read it with \fBLoadCredential=\fR.
.TP
.I /etc/default/idemgate
The listen addresses, the upstream of \fBidemgate http\fR, extra flags of each unit.
.TP
.I /var/lib/idemgate/idemgate.db
The SQLite store of the packaged config (the units' \fBStateDirectory=\fR; its dynamic
user \fIidemgate\fR is shared by both units). Run operator commands on it as root:
\fBsudo idemgate stats \-\-config /etc/idemgate/idemgate.toml\fR.
.TP
.I /usr/lib/systemd/system/idemgate-serve.service\fR, \fI/usr/lib/systemd/system/idemgate-http.service
The units of \fBidemgate serve\fR and \fBidemgate http\fR:
\fBsystemctl enable \-\-now idemgate-serve\fR. Both stop gracefully on SIGTERM.
.SH SEE ALSO
\fBsystemd.exec\fR(5), \fBsystemctl\fR(1), \fBjournalctl\fR(1);
/usr/share/doc/idemgate/README.md
"""


def run_help(binary, args):
    out = subprocess.run([binary, *args, "--help"], capture_output=True, text=True, check=True)
    return out.stdout


def parse_help(text):
    """-> (description, usage, [(section, [(name, text)])], footer lines)."""
    lines = text.rstrip("\n").split("\n")
    usage_at = next(i for i, line in enumerate(lines) if line.startswith("Usage:"))
    description = " ".join(line.strip() for line in lines[:usage_at] if line.strip())
    usage = lines[usage_at][len("Usage:"):].strip()
    blocks, block = [], []
    for line in lines[usage_at + 1:]:
        if line.strip():
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    if block:
        blocks.append(block)
    sections, footer = [], []
    for i, block in enumerate(blocks):
        if SECTION.match(block[0]) and all(line.startswith("  ") for line in block[1:]):
            sections.append((block[0][:-1], parse_entries(block[1:])))
        else:
            footer = [line for b in blocks[i:] for line in b + [""]][:-1]
            break
    return description, usage, sections, footer


def parse_entries(lines):
    """Entries start at column 2 with their text in a column (CLI11's: where -h,--help's text
    starts); a name too long for it has its text on the next lines, indented to the column."""
    column = next((line.index("Print this help") for line in lines if "Print this help" in line),
                  30)
    entries = []
    for line in lines:
        if line.startswith("  ") and not line.startswith("   "):
            if len(line) > column and line[column - 1] == " " and line[column] != " ":
                name, text = line[:column], line[column:]
            else:
                name, text = line, ""
            entries.append([name.strip(), text.strip()])
        elif entries:
            entries[-1][1] = (entries[-1][1] + " " + line.strip()).strip()
    return [tuple(e) for e in entries]


def roff(text):
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def render_entries(out, entries):
    for name, text in entries:
        out.append(".TP")
        out.append(f"\\fB{roff(name)}\\fR")
        out.append(roff(text) if text else "\\&")


def render_footer(out, footer):
    """Prose lines become paragraphs; two-space-indented lines (commands) stay as written."""
    prose, example = [], []

    def flush():
        if prose:
            out.append(".PP")
            out.append(roff(" ".join(prose)))
            prose.clear()
        if example:
            out.extend([".PP", ".RS 4", ".nf", *(roff(line[2:]) for line in example),
                        ".fi", ".RE"])
            example.clear()

    for line in footer:
        if not line.strip():
            flush()
        elif line.startswith("  "):
            if prose:
                flush()
            example.append(line)
        else:
            if example:
                flush()
            prose.append(line.strip())
    flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--output", required=True)
    a = p.parse_args()

    version = subprocess.run([a.binary, "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    description, usage, sections, footer = parse_help(run_help(a.binary, []))
    commands = next((e for s, e in sections if s.lower() == "subcommands"), [])
    if not commands:
        sys.exit("manpage.py: no subcommands in idemgate --help")

    out = [f'.TH IDEMGATE 1 "" "{roff(version)}" "User Commands"',
           ".SH NAME",
           "idemgate \\- idempotency gateway for AI-agent tool calls",
           ".SH SYNOPSIS",
           f"\\fBidemgate\\fR {roff(usage.removeprefix('idemgate').strip())}",
           ".br",
           "\\fBidemgate\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR",
           ".SH DESCRIPTION",
           roff(description)]
    render_footer(out, footer)
    for section, entries in sections:
        if section.lower() == "subcommands":
            continue
        out.append(f".SH {roff(section.upper())}")
        render_entries(out, entries)
    out.append(".SH COMMANDS")
    render_entries(out, commands)
    for name, _ in commands:
        sub_description, sub_usage, sub_sections, sub_footer = parse_help(run_help(a.binary,
                                                                                   [name]))
        out.append(f'.SS "idemgate {roff(name)}"')
        out.append(f"\\fB{roff(sub_usage)}\\fR")
        out.append(".PP")
        out.append(roff(sub_description))
        # Each command's footer ends with the global options, which OPTIONS above has.
        render_footer(out, [l for l in sub_footer if not l.startswith("Every command also takes")])
        for section, entries in sub_sections:
            out.append(".PP")
            out.append(f"\\fI{roff(section)}:\\fR")
            out.append(".RS 4")
            render_entries(out, entries)
            out.append(".RE")
    out.append(TRAILER.strip("\n"))

    page = "\n".join(out) + "\n"
    with open(a.output, "w") as f:
        f.write(page)
    with open(a.output + ".gz", "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as z:
            z.write(page.encode())


if __name__ == "__main__":
    main()

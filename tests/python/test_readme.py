"""What the README says that the daemons decide stays true.

- The port table ("Running on several hosts"): each row's flag has the
  default the row gives, as the daemon's --helpfull states it, and the
  fixed ports the README has a firewall open are the ones
  deploy/chorus.env.example sets.
- The failure table's mismatch row quotes, word for word, what every rank of
  such a call prints: four chorusctl ranks through the session's workers,
  three of them agreeing.
"""

import re
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

from conftest import CALL_TIMEOUT, REPO, Cluster, unique_group

README = REPO / "README.md"
ENV_EXAMPLE = REPO / "deploy" / "chorus.env.example"
DAEMONS = {"coordinator": "chorus-coordinator", "worker": "chorus-worker"}


def port_rows() -> List[Tuple[str, str, str]]:
    """(flag cell, default cell, whole row) of each row of the port table."""
    text = README.read_text()
    header = "| port | flag | default | who connects |"
    assert header in text, "README.md has no port table"
    rows = []
    for line in text[text.index(header):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 4, line
        rows.append((cells[1], cells[2], line))
    assert rows, "the port table has no rows"
    return rows


def flag_help(help_text: str, flag: str) -> str:
    """The --helpfull entry of `flag`, joined into one line."""
    match = re.search(rf"^\s+--{flag} \((.*?)\); default: (.*?);$",
                      help_text, re.MULTILINE | re.DOTALL)
    assert match, f"--{flag} is not in the help"
    return " ".join(match.group(0).split())


def helps(bins: Dict[str, Path]) -> Dict[str, str]:
    """{daemon: its --helpfull}; Abseil's help exits 1."""
    out = {}
    for daemon, program in DAEMONS.items():
        done = subprocess.run([str(bins[program]), "--helpfull"],
                              capture_output=True, text=True, timeout=60)
        out[daemon] = done.stdout + done.stderr
    return out


def test_readme_port_table_defaults_are_the_daemons(
        bins: Dict[str, Path]) -> None:
    """Every row names a flag of its daemon (or of both) and gives the
    default that flag has: the value --helpfull prints as its default, or
    the address its text says it defaults to, or "none" for an empty one.
    """
    texts = helps(bins)
    for flag_cell, default_cell, row in port_rows():
        flag = re.search(r"`--(\w+)`", flag_cell)
        assert flag, row
        daemons = [d for d in DAEMONS if d in flag_cell]
        if "either daemon" in flag_cell:
            daemons = list(DAEMONS)
        assert daemons, row
        given = re.match(r"`([^`]*)`", default_cell)
        for daemon in daemons:
            entry = flag_help(texts[daemon], flag.group(1))
            if given is None:
                assert default_cell.startswith("none"), row
                assert entry.endswith('default: "";'), entry
                continue
            value = given.group(1)
            assert (entry.endswith(f"default: {value};") or
                    entry.endswith(f'default: "{value}";') or
                    f"Default: {value} " in entry), (row, entry)


def test_readme_fixed_ports_are_the_example_flags_file() -> None:
    """The ports the README has a firewall open are those the systemd
    units' flags file sets, and the table's text names them all.
    """
    text = README.read_text()
    sentence = re.search(r"use ((?:\d+, )+\d+ and \d+)\)", text)
    assert sentence, "the README names no fixed ports"
    named = {int(p) for p in re.findall(r"\d+", sentence.group(1))}
    env = ENV_EXAMPLE.read_text()
    configured = {int(p) for p in re.findall(r"^CHORUS_\w+=\S*?:?(\d{4,5})$",
                                             env, re.MULTILINE)}
    assert named == configured, (named, configured)


def test_readme_mismatch_row_is_what_every_rank_prints(
        cluster: Cluster, bins: Dict[str, Path]) -> None:
    """The mismatch the README quotes (ranks 0-2 ask for 1024 elements,
    rank 3 for 2048), run as four chorusctl ranks: each prints exactly that
    status, with the group's own name.
    """
    row = next(line for line in README.read_text().splitlines()
               if line.startswith("| ranks disagree"))
    quoted = re.search(r"`(collective #1 of group (\S+) does not match "
                       r"across ranks: [^`]*)`", row)
    assert quoted, row
    group = unique_group()
    want = "INVALID_ARGUMENT: " + quoted.group(1).replace(
        f"group {quoted.group(2)} ", f"group {group} ")
    workers = [cluster.address("w0"), cluster.address("w1")]
    ranks = []
    for rank in range(4):
        count = 2048 if rank == 3 else 1024
        ranks.append(subprocess.Popen(
            [str(bins["chorusctl"]), f"--worker={workers[rank % 2]}",
             f"--group={group}", "--world=4", f"--rank={rank}",
             f"--timeout={int(CALL_TIMEOUT)}s", "--dtype=f32",
             "--fill=1", f"--count={count}", "allreduce"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for rank, process in enumerate(ranks):
        _, err = process.communicate(timeout=CALL_TIMEOUT + 30)
        assert process.returncode == 1, (rank, err)
        assert f"chorusctl: {want}\n" in err, (rank, err)

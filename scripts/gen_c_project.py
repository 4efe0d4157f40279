"""Writes a small C project for the mount benchmark's build step: a `configure` script that
probes the compiler as autoconf scripts do (many tiny test programs, compiled and removed),
then writes `config.h` and a `Makefile`; 150 C files with headers, built into a program
by `make -j2`. Usage: gen_c_project.py DIR
"""

import os
import sys

SOURCES = 150
PROBES = 40

CONFIGURE = """#!/bin/sh
# Probes the C compiler the way autoconf-generated scripts do: one tiny program per check.
set -e
CC=${CC:-cc}
: > config.h
i=0
while [ $i -lt %(probes)d ]; do
  cat > conftest.c <<EOF
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int probe_$i(void) { return (int) strlen("probe $i"); }
int main(void) { return probe_$i() > 100; }
EOF
  if $CC -O0 -o conftest conftest.c 2> conftest.err; then
    echo "#define HAVE_PROBE_$i 1" >> config.h
  fi
  rm -f conftest conftest.c conftest.err conftest.o
  i=$((i + 1))
done
printf 'CC = %%s\\nCFLAGS = -O1 -I.\\n' "$CC" > Makefile
cat Makefile.in >> Makefile
echo "configured: $i checks"
"""


def source(i: int) -> str:
    calls = "\n".join(f"    acc += helper_{i}_{k}(acc + {k});" for k in range(8))
    helpers = "\n".join(
        f"static int helper_{i}_{k}(int x) {{ return (x * {k + 3}) ^ (x >> {k % 5 + 1}); }}" for k in range(8)
    )
    return f"""#include "config.h"
#include "mod{i}.h"
#include <string.h>

{helpers}

int mod{i}(int seed) {{
    int acc = seed;
{calls}
    return acc + (int) strlen("mod{i}");
}}
"""


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "configure"), "w") as f:
        f.write(CONFIGURE % {"probes": PROBES})
    os.chmod(os.path.join(out, "configure"), 0o755)
    for i in range(SOURCES):
        with open(os.path.join(out, f"mod{i}.h"), "w") as f:
            f.write(f"#ifndef MOD{i}_H\n#define MOD{i}_H\nint mod{i}(int seed);\n#endif\n")
        with open(os.path.join(out, f"mod{i}.c"), "w") as f:
            f.write(source(i))
    includes = "".join(f'#include "mod{i}.h"\n' for i in range(SOURCES))
    calls = "".join(f"    acc += mod{i}(acc);\n" for i in range(SOURCES))
    with open(os.path.join(out, "main.c"), "w") as f:
        f.write(f"#include <stdio.h>\n{includes}\nint main(void) {{\n    int acc = 1;\n{calls}")
        f.write('    printf("%d\\n", acc);\n    return 0;\n}\n')
    objs = " ".join(f"mod{i}.o" for i in range(SOURCES))
    with open(os.path.join(out, "Makefile.in"), "w") as f:
        f.write(f"OBJS = main.o {objs}\n\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n")
        f.write("%.o: %.c config.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\nclean:\n\trm -f prog $(OBJS)\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gen_c_project.py DIR")
    main(sys.argv[1])

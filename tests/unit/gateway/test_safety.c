/*
 * test_safety.c: unit tests of the classifier (gateway/safety/): many
 * command lines and snippets per level, the tricky ones (quoted text is
 * an argument, not a command; wrappers and env assignments; pipes,
 * substitutions, sh -c), and that the most severe level wins.
 * Not for: enforcement.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/safety.h"

struct case_ {
	const char *text;
	const char *language;
	enum moat_safety_level want;
};

static void
check_cases(const struct case_ *cases, size_t n)
{
	int bad = 0;

	for (size_t i = 0; i < n; i++) {
		struct moat_safety_verdict v =
		    moat_safety_classify(cases[i].text, cases[i].language);

		assert_true(v.reason[0] != '\0');
		if (v.level != cases[i].want) {
			fprintf(stderr, "[%s] %s: got %s (%s), want %s\n",
			    cases[i].language ? cases[i].language : "sh",
			    cases[i].text, moat_safety_level_name(v.level),
			    v.reason, moat_safety_level_name(cases[i].want));
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

#define CHECK(arr) check_cases(arr, sizeof(arr) / sizeof(arr[0]))

static void
test_read(void **state)
{
	static const struct case_ cases[] = {
		{ "ls -la /", NULL, MOAT_SAFETY_READ },
		{ "cat /etc/passwd", "bash", MOAT_SAFETY_READ },
		{ "grep -r TODO src | head -20", NULL, MOAT_SAFETY_READ },
		{ "find . -name '*.c'", NULL, MOAT_SAFETY_READ },
		{ "echo rm -rf /", NULL, MOAT_SAFETY_READ },
		{ "echo 'rm -rf /; reboot'", NULL, MOAT_SAFETY_READ },
		{ "printf '%s\\n' \"shutdown now\"", NULL, MOAT_SAFETY_READ },
		{ "python3 -c 'print(1+1)'", NULL, MOAT_SAFETY_READ },
		{ "ls 2>/dev/null && echo ok || echo no", NULL,
		    MOAT_SAFETY_READ },
		{ "git status; git log --oneline -5", NULL, MOAT_SAFETY_READ },
		{ "cat file # rm -rf / in a comment", NULL, MOAT_SAFETY_READ },
		{ "FOO=1 env | sort", NULL, MOAT_SAFETY_READ },
		{ "wc -l $(ls)", NULL, MOAT_SAFETY_READ },
		{ "sed 's/a/b/' file.txt > /dev/null", NULL,
		    MOAT_SAFETY_READ },
		{ "print(open('data.csv').read())", "python",
		    MOAT_SAFETY_READ },
		{ "print('os.remove(x) is only text')", "python",
		    MOAT_SAFETY_READ },
		{ "# shutil.rmtree('/')\nprint(2)", "python",
		    MOAT_SAFETY_READ },
		{ "console.log(require('fs').readFileSync('a'))", "node",
		    MOAT_SAFETY_READ },
		{ "SELECT * FROM t", "sql", MOAT_SAFETY_READ },
		{ "", NULL, MOAT_SAFETY_READ },
		{ NULL, NULL, MOAT_SAFETY_READ },
		{ "dd if=/dev/zero bs=1M count=1 of=/dev/null", NULL,
		    MOAT_SAFETY_READ },
	};

	CHECK(cases);
}

static void
test_write(void **state)
{
	static const struct case_ cases[] = {
		{ "touch a.txt", NULL, MOAT_SAFETY_WRITE },
		{ "echo hi > out.txt", NULL, MOAT_SAFETY_WRITE },
		{ "echo hi >> log.txt", NULL, MOAT_SAFETY_WRITE },
		{ "cp a b", NULL, MOAT_SAFETY_WRITE },
		{ "mv old new", NULL, MOAT_SAFETY_WRITE },
		{ "mkdir -p build/out", NULL, MOAT_SAFETY_WRITE },
		{ "sed -i 's/a/b/' file.txt", NULL, MOAT_SAFETY_WRITE },
		{ "pip install requests", NULL, MOAT_SAFETY_WRITE },
		{ "python3 -m pip install numpy", NULL, MOAT_SAFETY_WRITE },
		{ "ls | tee listing.txt", NULL, MOAT_SAFETY_WRITE },
		{ "rm notes.txt", NULL, MOAT_SAFETY_WRITE },
		{ "cat <<EOF > /tmp/f\nrm -rf /\nEOF\n", NULL,
		    MOAT_SAFETY_WRITE },
		{ "./build.sh", NULL, MOAT_SAFETY_WRITE },
		{ "python3 train.py", NULL, MOAT_SAFETY_WRITE },
		{ "git commit -am x", NULL, MOAT_SAFETY_WRITE },
		{ "curl -o page.html http://x", NULL, MOAT_SAFETY_WRITE },
		{ "chmod +x run.sh", NULL, MOAT_SAFETY_WRITE },
		{ "with open('out.txt', 'w') as f:\n    f.write('x')",
		    "python", MOAT_SAFETY_WRITE },
		{ "open(path, mode='a').write('x')", "python",
		    MOAT_SAFETY_WRITE },
		{ "import pathlib\npathlib.Path('x').write_text('y')",
		    "python", MOAT_SAFETY_WRITE },
		{ "import subprocess\nsubprocess.run(['touch', 'x'])",
		    "python", MOAT_SAFETY_WRITE },
		{ "require('fs').writeFileSync('a', 'b')", "node",
		    MOAT_SAFETY_WRITE },
		{ "INSERT INTO t VALUES (1)", "sql", MOAT_SAFETY_WRITE },
	};

	CHECK(cases);
}

static void
test_system(void **state)
{
	static const struct case_ cases[] = {
		{ "mount -t tmpfs none /mnt", NULL, MOAT_SAFETY_SYSTEM },
		{ "sysctl -w net.ipv4.ip_forward=1", NULL,
		    MOAT_SAFETY_SYSTEM },
		{ "ip link set eth0 down", NULL, MOAT_SAFETY_SYSTEM },
		{ "iptables -F", NULL, MOAT_SAFETY_SYSTEM },
		{ "sudo modprobe nbd", NULL, MOAT_SAFETY_SYSTEM },
		{ "kill -9 1", NULL, MOAT_SAFETY_SYSTEM },
		{ "systemctl restart nginx", NULL, MOAT_SAFETY_SYSTEM },
		{ "chmod 777 /etc/shadow", NULL, MOAT_SAFETY_SYSTEM },
		{ "chown -R nobody /usr/local", NULL, MOAT_SAFETY_SYSTEM },
		{ "echo nameserver 1.1.1.1 > /etc/resolv.conf", NULL,
		    MOAT_SAFETY_SYSTEM },
		{ "echo 3 > /proc/sys/vm/drop_caches", NULL,
		    MOAT_SAFETY_SYSTEM },
		{ "cp evil /usr/bin/ls", NULL, MOAT_SAFETY_SYSTEM },
		{ "ls | sudo tee -a /etc/hosts", NULL, MOAT_SAFETY_SYSTEM },
		{ "apt-get install -y curl", NULL, MOAT_SAFETY_SYSTEM },
		{ "touch /boot/x", NULL, MOAT_SAFETY_SYSTEM },
		{ "import os\nos.system(cmd)", "python", MOAT_SAFETY_SYSTEM },
		{ "import subprocess\nsubprocess.run(args, shell=True)",
		    "python", MOAT_SAFETY_SYSTEM },
		{ "import os, signal\nos.kill(1, signal.SIGTERM)", "python",
		    MOAT_SAFETY_SYSTEM },
		{ "open('/etc/hosts', 'a').write('x')", "python",
		    MOAT_SAFETY_SYSTEM },
		{ "require('child_process').execSync(cmd)", "node",
		    MOAT_SAFETY_SYSTEM },
	};

	CHECK(cases);
}

static void
test_destructive(void **state)
{
	static const struct case_ cases[] = {
		{ "rm -rf build", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "rm -r --force /tmp/work", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "rm -R dir", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "rm a b c d e", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "rm *.log", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "find /tmp -name '*.o' -delete", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "find . -type f -exec rm {} \\;", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "ls *.tmp | xargs rm -f", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "dd if=/dev/zero of=disk.img bs=1M count=10", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "mkfs.ext4 disk.img", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "shred -u secrets.txt", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "truncate -s 0 data.db", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "git reset --hard HEAD~3", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "git clean -fd", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "cd /work && git clean -fdx", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "sqlite3 app.db 'DROP TABLE users'", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "DROP TABLE users;", "sql", MOAT_SAFETY_DESTRUCTIVE },
		{ "echo ok; sudo rm -rf /var/cache/apt", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "X=1 nohup rm -rf out &", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "sh -c 'rm -rf build'", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "bash -c \"echo a && rm -rf b\"", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "eval \"rm -rf x\"", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "echo $(rm -rf x)", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "echo `rm -rf x`", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "echo \"$(rm -rf x)\"", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "python3 -c 'import shutil; shutil.rmtree(\"d\")'", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "import os\nos.remove('a.txt')", "python",
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "import os\nos.unlink(p)", "python",
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "from shutil import rmtree\nrmtree('x')", "python",
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "import os\nos.system('rm -rf /tmp/x')", "python",
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "import subprocess\nsubprocess.run(['rm', '-rf', 'x'])",
		    "python", MOAT_SAFETY_DESTRUCTIVE },
		{ "cur.execute('DROP TABLE t')", "python",
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "require('fs').rmSync('d', {recursive: true})", "node",
		    MOAT_SAFETY_DESTRUCTIVE },
	};

	CHECK(cases);
}

static void
test_blocked(void **state)
{
	static const struct case_ cases[] = {
		{ ":(){ :|:& };:", NULL, MOAT_SAFETY_BLOCKED },
		{ ":() { : | : & }; :", NULL, MOAT_SAFETY_BLOCKED },
		{ "bomb() { bomb | bomb & }; bomb", NULL,
		    MOAT_SAFETY_BLOCKED },
		{ "rm -rf /", NULL, MOAT_SAFETY_BLOCKED },
		{ "rm -rf /*", NULL, MOAT_SAFETY_BLOCKED },
		{ "sudo rm -fr /", NULL, MOAT_SAFETY_BLOCKED },
		{ "sudo -u root rm -rf --no-preserve-root /", NULL,
		    MOAT_SAFETY_BLOCKED },
		{ "rm -rf /usr", NULL, MOAT_SAFETY_BLOCKED },
		{ "dd if=/dev/zero of=/dev/sda", NULL, MOAT_SAFETY_BLOCKED },
		{ "dd if=/dev/urandom of=/dev/vda bs=1M", NULL,
		    MOAT_SAFETY_BLOCKED },
		{ "mkfs.ext4 /dev/vdb", NULL, MOAT_SAFETY_BLOCKED },
		{ "mkfs -t xfs /dev/sdb1", NULL, MOAT_SAFETY_BLOCKED },
		{ "echo b > /proc/sysrq-trigger", NULL, MOAT_SAFETY_BLOCKED },
		{ "cat payload > /dev/mem", NULL, MOAT_SAFETY_BLOCKED },
		{ "echo c | sudo tee /proc/sysrq-trigger", NULL,
		    MOAT_SAFETY_BLOCKED },
		{ "shutdown -h now", NULL, MOAT_SAFETY_BLOCKED },
		{ "sudo reboot", NULL, MOAT_SAFETY_BLOCKED },
		{ "/sbin/halt", NULL, MOAT_SAFETY_BLOCKED },
		{ "poweroff", NULL, MOAT_SAFETY_BLOCKED },
		{ "ls; rm -rf / ; echo done", NULL, MOAT_SAFETY_BLOCKED },
		{ "sh -c 'rm -rf /'", NULL, MOAT_SAFETY_BLOCKED },
		{ "import os\nos.system('reboot')", "python",
		    MOAT_SAFETY_BLOCKED },
		{ "import os\nwhile True:\n    os.fork()", "python",
		    MOAT_SAFETY_BLOCKED },
		{ "open('/proc/sysrq-trigger', 'w').write('b')", "python",
		    MOAT_SAFETY_BLOCKED },
		{ "require('child_process').execSync('rm -rf /')", "node",
		    MOAT_SAFETY_BLOCKED },
	};

	CHECK(cases);
}

/* The most severe command of a line wins, whatever its position. */
static void
test_most_severe_wins(void **state)
{
	struct moat_safety_verdict v;

	v = moat_safety_classify("rm -rf build; ls; touch x", NULL);
	assert_int_equal(v.level, MOAT_SAFETY_DESTRUCTIVE);
	assert_non_null(strstr(v.reason, "rm"));
	v = moat_safety_classify("touch x && mount /dev/x /m && cat y", NULL);
	assert_int_equal(v.level, MOAT_SAFETY_SYSTEM);
	assert_non_null(strstr(v.reason, "mount"));
	v = moat_safety_classify("ls\nls\nreboot\nls", NULL);
	assert_int_equal(v.level, MOAT_SAFETY_BLOCKED);
}

static void
test_names(void **state)
{
	assert_string_equal(moat_safety_level_name(MOAT_SAFETY_READ), "read");
	assert_string_equal(moat_safety_level_name(MOAT_SAFETY_WRITE),
	    "write");
	assert_string_equal(moat_safety_level_name(MOAT_SAFETY_SYSTEM),
	    "system");
	assert_string_equal(moat_safety_level_name(MOAT_SAFETY_DESTRUCTIVE),
	    "destructive");
	assert_string_equal(moat_safety_level_name(MOAT_SAFETY_BLOCKED),
	    "blocked");
	assert_string_equal(moat_safety_level_name((enum moat_safety_level)42),
	    "unknown");
}

/* Garbage never crashes: unbalanced quotes and substitutions, lone
 * operators, deep nesting, a long line. */
static void
test_garbage(void **state)
{
	static const char *const junk[] = { "'", "\"", "$(", "`", "|||",
		";;;&&&", ">", "<<", "2>", "$((((", "echo \"$(echo \"$(ls",
		"sh -c \"sh -c 'sh -c \\\"sh -c rm\\\"'\"", "\\", "a\\", "()",
		"open(", "subprocess.run([", "os.system('", NULL };
	char *big = malloc(200001);

	for (int i = 0; junk[i] != NULL; i++) {
		moat_safety_classify(junk[i], NULL);
		moat_safety_classify(junk[i], "python");
		moat_safety_classify(junk[i], "node");
	}
	assert_non_null(big);
	for (int i = 0; i < 200000; i++)
		big[i] = "ls; x|"[i % 6];
	big[200000] = '\0';
	assert_int_equal(moat_safety_classify(big, NULL).level,
	    MOAT_SAFETY_WRITE); /* "x" is not a known command */
	free(big);
}

/* Each row of safety.c's command table, and each branch of its judges,
 * at least once (rows the cases above do not reach). */
static void
test_table_rows(void **state)
{
	static const struct case_ cases[] = {
		{ "init 0", NULL, MOAT_SAFETY_BLOCKED },
		{ "telinit 6", NULL, MOAT_SAFETY_BLOCKED },
		{ "init 3", NULL, MOAT_SAFETY_WRITE },
		{ "systemctl reboot", NULL, MOAT_SAFETY_BLOCKED },
		{ "systemctl status nginx", NULL, MOAT_SAFETY_SYSTEM },
		{ "mke2fs /dev/sdb1", NULL, MOAT_SAFETY_BLOCKED },
		{ "mkswap swapfile", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "wipefs -a disk.img", NULL, MOAT_SAFETY_DESTRUCTIVE },
		{ "perl -pi -e s/a/b/ f.txt", NULL, MOAT_SAFETY_WRITE },
		{ "perl script.pl", NULL, MOAT_SAFETY_WRITE },
		{ "ln -s a /usr/bin/a", NULL, MOAT_SAFETY_SYSTEM },
		{ "chgrp staff f", NULL, MOAT_SAFETY_WRITE },
		{ "rmdir build", NULL, MOAT_SAFETY_WRITE },
		{ "npm ls", NULL, MOAT_SAFETY_READ },
		{ "cargo build", NULL, MOAT_SAFETY_WRITE },
		{ "busybox rm -rf /", NULL, MOAT_SAFETY_BLOCKED },
		{ "busybox", NULL, MOAT_SAFETY_WRITE },
		{ "node -e \"console.log(1)\"", NULL, MOAT_SAFETY_READ },
		{ "node app.js", NULL, MOAT_SAFETY_WRITE },
		{ "deno run main.ts", NULL, MOAT_SAFETY_WRITE },
		{ "source env.sh", NULL, MOAT_SAFETY_WRITE },
		{ "psql -c \"DROP TABLE users\"", NULL,
		    MOAT_SAFETY_DESTRUCTIVE },
		{ "mysql -e \"select 1\"", NULL, MOAT_SAFETY_WRITE },
		{ "tar tvf a.tar", NULL, MOAT_SAFETY_READ },
		{ "tar xzf a.tar.gz", NULL, MOAT_SAFETY_WRITE },
		{ "gzip big.log", NULL, MOAT_SAFETY_WRITE },
		{ "make -j2", NULL, MOAT_SAFETY_WRITE },
		{ "curl -o out.html http://x", NULL, MOAT_SAFETY_WRITE },
		{ "hostname", NULL, MOAT_SAFETY_READ },
		{ "hostname sandbox", NULL, MOAT_SAFETY_SYSTEM },
	};

	CHECK(cases);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read),
		cmocka_unit_test(test_write),
		cmocka_unit_test(test_system),
		cmocka_unit_test(test_destructive),
		cmocka_unit_test(test_blocked),
		cmocka_unit_test(test_most_severe_wins),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_table_rows),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

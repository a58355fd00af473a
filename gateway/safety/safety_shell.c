/*
 * safety_shell.c: the shell side of the classifier of safety.h: a small
 * tokenizer (quotes, escapes, comments, operators, redirections,
 * here-documents, $(...) and backticks, whose contents are judged as
 * shell of their own) that cuts text into commands for safety.c to
 * judge, and the fork-bomb check.
 * Not for: what a command does (safety.c), or parsing shell in full.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/safety.h"
#include "safety_internal.h"

#define MAX_ARGS 256 /* words of one command that are looked at */
#define MAX_REDIRS 32

/* ---- fork bombs ---- */

/* A function that calls itself twice through a pipe in the background:
 * `:(){ :|:& };:` and `bomb(){ bomb|bomb& }; bomb`, spaces anywhere. */
static bool
is_fork_bomb(const char *text, size_t len)
{
	char *s = malloc(len + 1);
	size_t n = 0;
	bool found = false;
	char *p, *q;

	if (s == NULL)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!isspace((unsigned char)text[i]))
			s[n++] = text[i];
	s[n] = '\0';
	for (p = strstr(s, "(){"); p != NULL && !found;
	     p = strstr(p + 1, "(){")) {
		char name[64], pat[140];
		char *start = p;
		size_t nl;

		while (start > s &&
		    (isalnum((unsigned char)start[-1]) || start[-1] == '_' ||
		        start[-1] == ':' || start[-1] == '.'))
			start--;
		nl = (size_t)(p - start);
		if (nl == 0 || nl >= sizeof(name))
			continue;
		memcpy(name, start, nl);
		name[nl] = '\0';
		snprintf(pat, sizeof(pat), "%s|%s", name, name);
		q = strchr(p, '}');
		if (q == NULL)
			q = s + n;
		{
			char *hit = strstr(p + 3, pat);

			if (hit != NULL && hit < q && strchr(hit, '&') != NULL)
				found = true;
		}
	}
	free(s);
	return found;
}

/* ---- tokens ---- */

enum tok_kind {
	TOK_WORD,
	TOK_SEP, /* ; && || & newline ( ) */
	TOK_PIPE,
	TOK_REDIR_OUT, /* > >> >| &> ; next word is the target */
	TOK_REDIR_IN,  /* < <<< ; next word is read */
	TOK_HEREDOC,   /* << / <<- ; next word is the delimiter */
	TOK_END,
	TOK_AGAIN, /* inside the lexer only: nothing to return, lex on */
};

struct lexer {
	const char *s;
	size_t len, pos;
	char *word;       /* the current word's text (heap, len + 1) */
	bool quoted;      /* some of it was quoted */
	char heredoc[64]; /* a delimiter waiting for the newline */
	bool heredoc_pending, heredoc_tabs;
	struct safety_judge *j;
	int depth;
};

static bool
is_op_char(char c)
{
	return c == ';' || c == '&' || c == '|' || c == '<' || c == '>' ||
	    c == '(' || c == ')' || c == '\n';
}

/* skip_subst: s[pos] is just past "$(" (or a backtick when `tick`);
 * returns the index of the closing ")" or backtick (len when none). */
static size_t
skip_subst(const char *s, size_t len, size_t pos, bool tick)
{
	int level = 1;
	char q = 0;

	for (; pos < len; pos++) {
		char c = s[pos];

		if (q != 0) {
			if (c == '\\' && q == '"' && pos + 1 < len)
				pos++;
			else if (c == q)
				q = 0;
			continue;
		}
		if (c == '\\' && pos + 1 < len) {
			pos++;
		} else if (tick) {
			if (c == '`')
				return pos;
		} else if (c == '\'' || c == '"') {
			q = c;
		} else if (c == '(') {
			level++;
		} else if (c == ')' && --level == 0) {
			return pos;
		}
	}
	return len;
}

/* skip_heredoc_body: at the start of a line after a here-document's
 * redirection: skips lines up to and including the delimiter line. */
static void
skip_heredoc_body(struct lexer *lx)
{
	size_t dl = strlen(lx->heredoc);

	while (lx->pos < lx->len) {
		size_t eol = lx->pos, start = lx->pos;

		while (eol < lx->len && lx->s[eol] != '\n')
			eol++;
		if (lx->heredoc_tabs)
			while (start < eol && lx->s[start] == '\t')
				start++;
		lx->pos = eol < lx->len ? eol + 1 : eol;
		if (eol - start == dl &&
		    memcmp(lx->s + start, lx->heredoc, dl) == 0)
			break;
	}
	lx->heredoc_pending = false;
}

/* peek: the character `ahead` places past the cursor, '\0' past the
 * end (only ever compared with non-NUL characters). */
static char
peek(const struct lexer *lx, size_t ahead)
{
	return lx->pos + ahead < lx->len ? lx->s[lx->pos + ahead] : '\0';
}

static bool
is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* skip_blanks: past blanks, line continuations and comments. */
static void
skip_blanks(struct lexer *lx)
{
	for (;;) {
		while (lx->pos < lx->len && is_blank(lx->s[lx->pos]))
			lx->pos++;
		if (peek(lx, 0) == '\\' && peek(lx, 1) == '\n') {
			lx->pos += 2;
			continue;
		}
		if (peek(lx, 0) == '#') {
			while (lx->pos < lx->len && lx->s[lx->pos] != '\n')
				lx->pos++;
			continue;
		}
		break;
	}
}

/* skip_fd_dup: s[pos] is the '&' of ">&2" or "<&-": a duplication of a
 * descriptor, which names no file, so it is skipped whole. */
static void
skip_fd_dup(struct lexer *lx)
{
	lx->pos++;
	while (lx->pos < lx->len &&
	    (isdigit((unsigned char)lx->s[lx->pos]) || lx->s[lx->pos] == '-'))
		lx->pos++;
}

/* lex_redirection: s[pos] is '>' or '<'. */
static enum tok_kind
lex_redirection(struct lexer *lx)
{
	char c = lx->s[lx->pos++];

	if (c == '>') {
		if (peek(lx, 0) == '>' || peek(lx, 0) == '|') {
			lx->pos++;
		} else if (peek(lx, 0) == '&') {
			skip_fd_dup(lx);
			return TOK_AGAIN;
		}
		return TOK_REDIR_OUT;
	}
	if (peek(lx, 0) == '<') {
		lx->pos++;
		if (peek(lx, 0) == '<') {
			lx->pos++;
			return TOK_REDIR_IN;
		}
		lx->heredoc_tabs = peek(lx, 0) == '-';
		if (lx->heredoc_tabs)
			lx->pos++;
		return TOK_HEREDOC;
	}
	if (peek(lx, 0) == '&') {
		skip_fd_dup(lx);
		return TOK_AGAIN;
	}
	return TOK_REDIR_IN;
}

/* lex_operator: s[pos] is one of is_op_char's characters. */
static enum tok_kind
lex_operator(struct lexer *lx)
{
	char c = lx->s[lx->pos];

	if (c == '\n') {
		lx->pos++;
		if (lx->heredoc_pending)
			skip_heredoc_body(lx);
		return TOK_SEP;
	}
	if (c == '&' && peek(lx, 1) == '>') {
		lx->pos += 2;
		if (peek(lx, 0) == '>')
			lx->pos++;
		return TOK_REDIR_OUT;
	}
	if (c == '>' || c == '<')
		return lex_redirection(lx);
	lx->pos++;
	if (c == '|') {
		if (peek(lx, 0) == '|') {
			lx->pos++;
			return TOK_SEP;
		}
		if (peek(lx, 0) == '&')
			lx->pos++;
		return TOK_PIPE;
	}
	/* & ; ( ) and the doubled && ;; */
	if ((c == '&' || c == ';') && peek(lx, 0) == c)
		lx->pos++;
	return TOK_SEP;
}

/* copy_until: appends s[pos..end) to the word. */
static void
copy_until(struct lexer *lx, size_t *n, size_t end)
{
	while (lx->pos < end)
		lx->word[(*n)++] = lx->s[lx->pos++];
}

static bool
starts_subst(const struct lexer *lx)
{
	return (peek(lx, 0) == '$' && peek(lx, 1) == '(') ||
	    peek(lx, 0) == '`';
}

/* lex_subst: s[pos] starts "$(" or a backtick. The contents are judged
 * as shell of their own; the substitution's text stays in the word. */
static void
lex_subst(struct lexer *lx, size_t *n)
{
	bool tick = lx->s[lx->pos] == '`';
	size_t start = lx->pos + (tick ? 1 : 2);
	size_t end = skip_subst(lx->s, lx->len, start, tick);

	moat_safety_shell(lx->j, lx->s + start, end - start, lx->depth + 1);
	copy_until(lx, n, end);
	if (lx->pos < lx->len)
		lx->word[(*n)++] = lx->s[lx->pos++];
}

/* lex_escaped: s[pos] is a backslash with a character after it. */
static void
lex_escaped(struct lexer *lx, size_t *n)
{
	lx->word[(*n)++] = lx->s[lx->pos + 1];
	lx->pos += 2;
}

static void
lex_single_quoted(struct lexer *lx, size_t *n)
{
	lx->quoted = true;
	lx->pos++;
	while (lx->pos < lx->len && lx->s[lx->pos] != '\'')
		lx->word[(*n)++] = lx->s[lx->pos++];
	if (lx->pos < lx->len)
		lx->pos++;
}

/* lex_double_quoted: escapes and substitutions still work inside. */
static void
lex_double_quoted(struct lexer *lx, size_t *n)
{
	lx->quoted = true;
	lx->pos++;
	while (lx->pos < lx->len && lx->s[lx->pos] != '"') {
		if (lx->s[lx->pos] == '\\' && lx->pos + 1 < lx->len)
			lex_escaped(lx, n);
		else if (starts_subst(lx))
			lex_subst(lx, n);
		else
			lx->word[(*n)++] = lx->s[lx->pos++];
	}
	if (lx->pos < lx->len)
		lx->pos++;
}

static bool
all_digits(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char)s[i]))
			return false;
	return true;
}

/* lex_word: s[pos] starts a word, which ends at a blank or operator. */
static enum tok_kind
lex_word(struct lexer *lx)
{
	size_t n = 0;

	while (lx->pos < lx->len) {
		char c = lx->s[lx->pos];

		if (is_blank(c) || is_op_char(c))
			break;
		if (c == '\\' && lx->pos + 1 < lx->len) {
			lx->quoted = true;
			lex_escaped(lx, &n);
		} else if (c == '\'') {
			lex_single_quoted(lx, &n);
		} else if (c == '"') {
			lex_double_quoted(lx, &n);
		} else if (starts_subst(lx)) {
			lex_subst(lx, &n);
		} else {
			lx->word[n++] = lx->s[lx->pos++];
		}
	}
	lx->word[n] = '\0';
	/* "2>file": the digits were a file descriptor */
	if (!lx->quoted && n > 0 &&
	    (peek(lx, 0) == '>' || peek(lx, 0) == '<') &&
	    all_digits(lx->word, n))
		return TOK_AGAIN;
	return TOK_WORD;
}

/* next_token: the next token; a word's text is in lx->word. */
static enum tok_kind
next_token(struct lexer *lx)
{
	enum tok_kind t;

	do {
		lx->quoted = false;
		lx->word[0] = '\0';
		skip_blanks(lx);
		if (lx->pos >= lx->len)
			return TOK_END;
		if (is_op_char(lx->s[lx->pos]))
			t = lex_operator(lx);
		else
			t = lex_word(lx);
	} while (t == TOK_AGAIN);
	return t;
}

/* ---- commands ---- */

struct command {
	char *argv[MAX_ARGS];
	int argc;
	char *redir_out[MAX_REDIRS];
	int n_redir_out;
};

void
moat_safety_shell(struct safety_judge *j, const char *text, size_t len,
    int depth)
{
	struct lexer lx = { .s = text, .len = len, .j = j, .depth = depth };
	struct command *c = NULL;
	char *arena = NULL;
	size_t used = 0;
	enum tok_kind t, pending = TOK_WORD; /* a redirection waiting */

	if (depth > MOAT_SAFETY_MAX_DEPTH || len == 0)
		return;
	if (is_fork_bomb(text, len)) {
		moat_safety_raise(j, MOAT_SAFETY_BLOCKED, "fork bomb");
		return;
	}
	/* The arena holds every word of the text: each fits in len + 1,
	 * and all of them together in 2 * len + words. */
	if ((lx.word = malloc(len + 1)) == NULL ||
	    (arena = malloc(2 * len + 2)) == NULL ||
	    (c = calloc(1, sizeof(*c))) == NULL) {
		j->oom = true;
		goto done;
	}
	for (;;) {
		t = next_token(&lx);
		if (t == TOK_WORD) {
			size_t wl = strlen(lx.word);
			char *copy;

			if (used + wl + 1 > 2 * len + 2)
				break; /* cannot happen: words come from text */
			copy = arena + used;
			memcpy(copy, lx.word, wl + 1);
			used += wl + 1;
			if (pending == TOK_REDIR_OUT) {
				if (c->n_redir_out < MAX_REDIRS)
					c->redir_out[c->n_redir_out++] = copy;
			} else if (pending == TOK_HEREDOC) {
				snprintf(lx.heredoc, sizeof(lx.heredoc), "%s",
				    copy);
				lx.heredoc_pending = true;
			} else if (pending != TOK_REDIR_IN &&
			    c->argc < MAX_ARGS) {
				c->argv[c->argc++] = copy;
			}
			pending = TOK_WORD;
			continue;
		}
		if (t == TOK_REDIR_OUT || t == TOK_REDIR_IN ||
		    t == TOK_HEREDOC) {
			pending = t;
			continue;
		}
		/* a separator, a pipe or the end: the command is whole */
		pending = TOK_WORD;
		moat_safety_command(j, c->argv, c->argc, c->redir_out,
		    c->n_redir_out, depth);
		memset(c, 0, sizeof(*c));
		if (t == TOK_END)
			break;
	}
done:
	free(lx.word);
	free(arena);
	free(c);
}

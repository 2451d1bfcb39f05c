/* The compiled read path of loadgen's plain-http connections (loadgen/transport/readpath.py).

   A Reader's `readable` is registered as the event loop's reader callback of one socket, so a
   read runs no Python frame: recvmsg with SO_TIMESTAMPNS, the kernel stamp converted to
   perf_counter_ns, the HTTP/1.1 body framing undone (chunked, Content-Length, read until
   close), and the body split into pieces of complete lines with the read's stamp, exactly as
   connection.Connection.on_body does. The pieces wait in the Reader, their stamps in a C array, until the
   connection takes them as a batch (take_batch, from Connection.deliver): no Python object is
   made per piece but the piece's bytes, and none for a piece the Reader counts (below). It calls
   into Python (the connection, a connection.Connection) only when a response head is complete (take_head:
   httptools parses it, as on the Python path), when a batch is full (deliver), at the message's
   end (finish_body; a chunked body's last chunk and trailer go through its llhttp parser there),
   for the body of a response that does not stream (on_body), on malformed framing
   (malformed_body) and on EOF or a socket error (the transport's lost). Everything else about a
   connection stays in connection.py and raw_socket.py.

   When the connection asks for it (take_head's mode COUNTED), each piece that is one SSE content
   event of the plain shape count_content_tokens takes is counted as it is read, while its bytes
   are still in the cache, and kept as its count alone: the batch hands it over as None with its
   count, and every other piece as its bytes with the count 0, for the line rules.

   It also counts the token ids of a batch of SSE content events (count_content_tokens, for
   loadgen/transport/http.py) without building their objects: each piece that holds one event of
   the one plain shape it fully validates is counted, and any other piece is left to orjson.

   READ_PATH_VERSION changes with what the module offers or how it behaves: readpath.py takes a build
   only of the version it expects, so a build of an older source left in a checkout is not used.

   Limited API (abi3): one build loads on CPython 3.10 and later. Linux only (SO_TIMESTAMPNS). */

#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* readpath.READ_PATH_VERSION must match: 3 = the counter answers piece by piece (0: orjson's);
   4 = the Reader keeps a batch's pieces itself (take_batch) and counts them as it reads (COUNTED). */
#define READ_PATH_VERSION 4

/* Body framings besides a length, as Connection.take_head returns them (readpath.py's constants;
   its NO_BODY, -1, needs no test here: a head without a body leaves the reader at the next head). */
#define BODY_CHUNKED (-2)
#define BODY_UNTIL_CLOSE (-3)

/* How a body reaches the connection, as Connection.take_head returns it (readpath.py's constants). */
#define WHOLE 0    /* not streamed: on_body gets the bytes */
#define PIECES 1   /* pieces of whole lines, in batches */
#define COUNTED 2  /* the same, plain SSE content events counted here and handed over as their counts */

/* A response head, or a chunked body's trailer, larger than this is malformed: the buffer that
   holds it while it arrives stays bounded whatever the server sends. */
#define HEAD_LIMIT (64 * 1024)

/* The kernel stamp's control messages. raw_socket.py asks for SO_TIMESTAMPNS_OLD (35), whose stamp is
   two C longs, also where SCM_TIMESTAMPNS means SO_TIMESTAMPNS_NEW (32-bit systems with a 64-bit
   time_t), whose stamp is two 64-bit integers: either is taken. */
#ifdef SO_TIMESTAMPNS_OLD
#define STAMP_OLD SO_TIMESTAMPNS_OLD
#else
#define STAMP_OLD SCM_TIMESTAMPNS
#endif
#ifdef SO_TIMESTAMPNS_NEW
#define STAMP_NEW SO_TIMESTAMPNS_NEW
#else
#define STAMP_NEW (-1)  /* no such message */
#endif

enum state {
    HEAD,            /* bytes up to the blank line that ends a response head */
    CHUNK_SIZE,      /* hex digits of a chunk's size */
    /* Chunk extensions after the size (`;name`, `;name=token`, `;name="quoted"`), skipped once
       checked as llhttp checks them (the Python path's parser): */
    EXT_START,       /* after a `;` */
    EXT_NAME,
    EXT_VALUE_START, /* after a `=` */
    EXT_VALUE,
    EXT_QUOTED,      /* inside a quoted value */
    EXT_QUOTED_PAIR, /* after a backslash in it */
    EXT_QUOTED_END,  /* after its closing quote */
    CHUNK_SIZE_LF,   /* the LF after the size line's CR */
    CHUNK_DATA,
    CHUNK_DATA_CR,   /* the CRLF after a chunk's data */
    CHUNK_DATA_LF,
    TRAILER_START,   /* after the last chunk: a trailer line or the final CRLF */
    TRAILER_LINE,
    TRAILER_LINE_LF, /* the LF after a trailer line's CR */
    TRAILER_END_LF,
    BODY_LENGTH,     /* `remaining` bytes of a Content-Length body */
    BODY_CLOSE,      /* everything until the server closes */
};

/* Set once by configure() (raw_socket.py holds the values); the stamp conversion's state is shared by
   every Reader, as raw_socket's one _RealtimeToPerfCounter is. */
static PyObject *offset_source;  /* CLOCK_REALTIME - CLOCK_MONOTONIC, in ns, when called */
static long long refresh_ns;
static long long stamp_offset;
static long long offset_valid_until;
static Py_ssize_t batch_pieces;
static Py_ssize_t read_size;
/* The buffer reads go into, shared while it is free: a read walks it while calling into Python,
   where another thread's Reader (or a nested call) may read; that read gets a buffer of its own. */
static char *read_buffer;
static int read_buffer_busy;

/* Attribute and method names, interned once. */
static PyObject *s_received, *s_closed, *s_line, *s_deliver, *s_take_head,
    *s_finish_body, *s_on_body, *s_malformed_body, *s_fail_unexpected;

typedef struct {
    PyObject_HEAD
    int fd;
    PyObject *conn;  /* the connection.Connection it reads for */
    PyObject *lost;  /* the transport's _lost(exc or None): closes the socket, fails or ends the request */
    enum state state;
    int closed;         /* the connection closed: nothing more is read */
    int mode;           /* how the body goes to the connection: WHOLE, PIECES or COUNTED */
    int size_digits;
    long long remaining;  /* bytes left of the chunk, or of a Content-Length body; a chunk's size while read */
    long long now;        /* the current read's stamp */
    char *head;           /* the response head so far, or a chunked body's trailer */
    Py_ssize_t head_len, head_cap, head_scanned;
    char *line;           /* the partial body line (no LF in it) */
    Py_ssize_t line_len, line_cap;
    /* The pieces not yet taken (take_batch): each one's stamp and count (0: its bytes are the
       next item of `kept`), in order. */
    long long *stamps;
    Py_ssize_t *counts;
    Py_ssize_t pending, pending_cap;
    PyObject *kept;       /* list of the pending pieces' bytes that were not counted, or NULL */
} Reader;

static Py_ssize_t event_tokens(const char *data, Py_ssize_t size);

static long long monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);  /* perf_counter_ns's clock on Linux */
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* The read's kernel receive time in perf_counter_ns, or now when it carries none. -1 on error. */
static int read_stamp(struct msghdr *message, long long *stamp)
{
    struct cmsghdr *item;
    for (item = CMSG_FIRSTHDR(message); item != NULL; item = CMSG_NXTHDR(message, item)) {
        long long realtime;
        if (item->cmsg_level != SOL_SOCKET)
            continue;
        if (item->cmsg_type == STAMP_OLD) {
            long arrival[2];
            memcpy(arrival, CMSG_DATA(item), sizeof arrival);
            realtime = (long long)arrival[0] * 1000000000LL + arrival[1];
        } else if (item->cmsg_type == STAMP_NEW) {
            long long arrival[2];
            memcpy(arrival, CMSG_DATA(item), sizeof arrival);
            realtime = arrival[0] * 1000000000LL + arrival[1];
        } else {
            continue;
        }
        if (realtime >= offset_valid_until) {
            PyObject *offset = PyObject_CallNoArgs(offset_source);
            if (offset == NULL)
                return -1;
            stamp_offset = PyLong_AsLongLong(offset);
            Py_DECREF(offset);
            if (stamp_offset == -1 && PyErr_Occurred())
                return -1;
            offset_valid_until = realtime + refresh_ns;
        }
        *stamp = realtime - stamp_offset;
        return 0;
    }
    *stamp = monotonic_ns();
    return 0;
}

static int grow(char **buffer, Py_ssize_t *capacity, Py_ssize_t needed)
{
    if (needed <= *capacity)
        return 0;
    Py_ssize_t size = *capacity ? *capacity : 256;
    while (size < needed)
        size *= 2;
    char *bigger = realloc(*buffer, (size_t)size);
    if (bigger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buffer = bigger;
    *capacity = size;
    return 0;
}

static int stopped(Reader *self)
{
    PyObject *closed = PyObject_GetAttr(self->conn, s_closed);
    if (closed == NULL)
        return -1;
    int yes = PyObject_IsTrue(closed);
    Py_DECREF(closed);
    return yes;
}

/* Call a method of the connection; returns its result, or NULL with the error set. */
static PyObject *call_conn(Reader *self, PyObject *name, PyObject *arg1, PyObject *arg2)
{
    return PyObject_CallMethodObjArgs(self->conn, name, arg1, arg2, NULL);
}

/* One piece of whole lines that arrived at the read's stamp: its bytes (`piece`, or NULL when it
   was counted) or its count. A full batch goes to the connection (deliver), which takes it.
   Returns 1 when the connection closed meanwhile, -1 on error. */
static int take_piece(Reader *self, PyObject *piece, Py_ssize_t count)
{
    if (self->pending == self->pending_cap) {
        Py_ssize_t size = self->pending_cap ? 2 * self->pending_cap : 128;
        long long *stamps = realloc(self->stamps, (size_t)size * sizeof *stamps);
        if (stamps != NULL)
            self->stamps = stamps;
        Py_ssize_t *counts = stamps == NULL ? NULL : realloc(self->counts, (size_t)size * sizeof *counts);
        if (counts == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->counts = counts;
        self->pending_cap = size;
    }
    if (piece != NULL) {
        if (self->kept == NULL && (self->kept = PyList_New(0)) == NULL)
            return -1;
        if (PyList_Append(self->kept, piece) < 0)
            return -1;
    }
    self->stamps[self->pending] = self->now;
    self->counts[self->pending] = count;
    if (++self->pending < batch_pieces)
        return 0;
    PyObject *result = call_conn(self, s_deliver, NULL, NULL);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return stopped(self);
}

/* A span of body bytes of one read (Connection.on_body's rules). Returns as take_piece. */
static int body_span(Reader *self, const char *data, Py_ssize_t size)
{
    if (size == 0)
        return 0;
    if (self->mode == WHOLE) {
        PyObject *bytes = PyBytes_FromStringAndSize(data, size);
        if (bytes == NULL)
            return -1;
        PyObject *result = call_conn(self, s_on_body, bytes, NULL);
        Py_DECREF(bytes);
        if (result == NULL)
            return -1;
        Py_DECREF(result);
        return 0;
    }
    PyObject *piece;
    if (self->line_len == 0 && data[size - 1] == '\n') {  /* the usual piece: whole lines */
        Py_ssize_t count = self->mode == COUNTED ? event_tokens(data, size) : 0;
        if (count > 0)
            return take_piece(self, NULL, count);
        piece = PyBytes_FromStringAndSize(data, size);
    } else {
        const char *last = memrchr(data, '\n', (size_t)size);
        if (last == NULL) {
            if (grow(&self->line, &self->line_cap, self->line_len + size) < 0)
                return -1;
            memcpy(self->line + self->line_len, data, (size_t)size);
            self->line_len += size;
            return 0;
        }
        Py_ssize_t end = last - data + 1;
        piece = PyBytes_FromStringAndSize(NULL, self->line_len + end);
        if (piece == NULL)
            return -1;
        char *text = PyBytes_AsString(piece);
        if (self->line_len)  /* line is NULL until a partial line came */
            memcpy(text, self->line, (size_t)self->line_len);
        memcpy(text + self->line_len, data, (size_t)end);
        self->line_len = size - end;
        if (self->line_len) {
            if (grow(&self->line, &self->line_cap, self->line_len) < 0) {
                Py_DECREF(piece);
                return -1;
            }
            memcpy(self->line, data + end, (size_t)self->line_len);
        }
    }
    if (piece == NULL)
        return -1;
    Py_ssize_t count = 0;
    if (self->mode == COUNTED) {
        char *text;
        Py_ssize_t length;
        if (PyBytes_AsStringAndSize(piece, &text, &length) < 0) {
            Py_DECREF(piece);
            return -1;
        }
        count = event_tokens(text, length);
    }
    int result = take_piece(self, count > 0 ? NULL : piece, count);
    Py_DECREF(piece);
    return result;
}

/* The partial line the body ends with, as bytes (empty when none or not streamed). */
static PyObject *partial_line(Reader *self)
{
    Py_ssize_t length = self->mode != WHOLE ? self->line_len : 0;
    self->line_len = 0;
    return PyBytes_FromStringAndSize(length ? self->line : "", length);
}

/* The body is complete: the connection ends the request. A chunked body's end with a trailer (its
   last chunk and trailer, kept in the head buffer) goes to the connection's llhttp parser, which
   takes the trailer's fields into the headers as on the Python path; the usual end, `0\r\n\r\n`,
   has nothing for llhttp to take, and the body completes as one of other framing does (end b"").
   Returns as take_piece. */
static int body_complete(Reader *self, int chunked)
{
    self->state = HEAD;
    PyObject *line = partial_line(self);
    PyObject *now = PyLong_FromLongLong(self->now);
    int trailer = chunked && self->head_len > 2;  /* more than the final CRLF */
    PyObject *end = PyBytes_FromStringAndSize(NULL, trailer ? 3 + self->head_len : 0);
    self->head_len = 0;
    if (end != NULL && trailer) {
        memcpy(PyBytes_AsString(end), "0\r\n", 3);
        memcpy(PyBytes_AsString(end) + 3, self->head, (size_t)(PyBytes_Size(end) - 3));
    }
    PyObject *result = line && now && end
        ? PyObject_CallMethodObjArgs(self->conn, s_finish_body, line, now, end, NULL) : NULL;
    Py_XDECREF(line);
    Py_XDECREF(now);
    Py_XDECREF(end);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return stopped(self);
}

static int malformed(Reader *self, const char *detail)
{
    PyObject *text = PyUnicode_FromString(detail);
    if (text == NULL)
        return -1;
    PyObject *result = call_conn(self, s_malformed_body, text, NULL);
    Py_DECREF(text);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 1;  /* the connection closed */
}

/* Where the head in the buffer ends (after its blank line), or 0 while it has not. */
static Py_ssize_t head_end(Reader *self)
{
    const char *head = self->head;
    Py_ssize_t at = self->head_scanned;
    while (at < self->head_len) {
        const char *lf = memchr(head + at, '\n', (size_t)(self->head_len - at));
        if (lf == NULL)
            break;
        Py_ssize_t i = lf - head;
        if (i + 1 < self->head_len && head[i + 1] == '\n')
            return i + 2;
        if (i + 2 < self->head_len && head[i + 1] == '\r' && head[i + 2] == '\n')
            return i + 3;
        if (i + 2 >= self->head_len) {  /* the blank line may still be coming */
            self->head_scanned = i;
            return 0;
        }
        at = i + 1;
    }
    self->head_scanned = self->head_len;
    return 0;
}

/* Bytes of a response head; *used says how many of them belong to it. Returns as take_piece. */
static int head_bytes(Reader *self, const char *data, Py_ssize_t size, Py_ssize_t *used)
{
    if (self->head_len == 0 && (data[0] == '\r' || data[0] == '\n')) {
        *used = 1;  /* CR/LF before a response (after a body's end), skipped as llhttp does */
        return 0;
    }
    Py_ssize_t before = self->head_len;
    if (grow(&self->head, &self->head_cap, before + size) < 0)
        return -1;
    memcpy(self->head + before, data, (size_t)size);
    self->head_len += size;
    Py_ssize_t end = head_end(self);
    if (end > HEAD_LIMIT || (end == 0 && self->head_len > HEAD_LIMIT))
        return malformed(self, "response head larger than 64 KiB");
    Py_ssize_t prefix = self->head_len < 5 ? self->head_len : 5;
    if (end == 0 && memcmp(self->head, "HTTP/", (size_t)prefix) != 0)
        end = self->head_len;  /* not a response: httptools names what is wrong */
    if (end == 0) {
        *used = size;
        return 0;
    }
    *used = end - before;
    PyObject *head = PyBytes_FromStringAndSize(self->head, end);
    self->head_len = self->head_scanned = 0;
    if (head == NULL)
        return -1;
    PyObject *now = PyLong_FromLongLong(self->now);
    if (now == NULL) {
        Py_DECREF(head);
        return -1;
    }
    PyObject *framing = call_conn(self, s_take_head, head, now);
    Py_DECREF(head);
    Py_DECREF(now);
    if (framing == NULL)
        return -1;
    long long length;
    int mode;
    if (!PyArg_ParseTuple(framing, "Li", &length, &mode)) {
        Py_DECREF(framing);
        return -1;
    }
    if (mode != WHOLE && mode != PIECES && mode != COUNTED) {
        Py_DECREF(framing);
        PyErr_SetString(PyExc_ValueError, "take_head: the body's mode is not WHOLE, PIECES or COUNTED");
        return -1;
    }
    Py_DECREF(framing);
    int closed = stopped(self);
    if (closed != 0)
        return closed;
    self->mode = mode;
    self->line_len = 0;
    if (length == BODY_CHUNKED) {
        self->state = CHUNK_SIZE;
        self->remaining = 0;
        self->size_digits = 0;
    } else if (length == BODY_UNTIL_CLOSE) {
        self->state = BODY_CLOSE;
    } else if (length > 0) {
        self->state = BODY_LENGTH;
        self->remaining = length;
    }  /* NO_BODY (or an empty one, which the head's parse completed): the next head */
    return 0;
}

/* RFC 9110's tchar: the characters of a token. */
static int is_token(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
        || (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* A byte a quoted value may hold as it is (qdtext), or after a backslash when `escaped`. */
static int is_quoted_text(char c, int escaped)
{
    unsigned char u = (unsigned char)c;
    return u == '\t' || (u >= ' ' && u != 0x7f && (escaped || (u != '"' && u != '\\')));
}

/* One byte of a chunk's extensions: the next state, or -1 when llhttp rejects it. */
static int extension_state(enum state state, char c)
{
    int separator = c == ';' ? EXT_START : c == '\r' ? CHUNK_SIZE_LF : -1;
    switch (state) {
    case EXT_START:  /* no CR here: a `;` needs a name or value after it */
        return is_token(c) ? EXT_NAME : c == '=' ? EXT_VALUE_START : c == ';' ? EXT_START : -1;
    case EXT_NAME:
        return is_token(c) ? EXT_NAME : c == '=' ? EXT_VALUE_START : separator;
    case EXT_VALUE_START:
        return is_token(c) ? EXT_VALUE : c == '"' ? EXT_QUOTED : separator;
    case EXT_VALUE:  /* llhttp takes a quoted part after a token's too */
        return is_token(c) ? EXT_VALUE : c == '"' ? EXT_QUOTED : separator;
    case EXT_QUOTED:
        return c == '"' ? EXT_QUOTED_END : c == '\\' ? EXT_QUOTED_PAIR
            : is_quoted_text(c, 0) ? EXT_QUOTED : -1;
    case EXT_QUOTED_PAIR:
        return is_quoted_text(c, 1) ? EXT_QUOTED : -1;
    default:  /* EXT_QUOTED_END */
        return separator;
    }
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One byte of chunked framing outside a chunk's data. Returns as take_piece. */
static int chunk_byte(Reader *self, char c)
{
    switch (self->state) {
    case CHUNK_SIZE: {
        int digit = hex_value(c);
        if (digit >= 0) {
            if (self->remaining > (LLONG_MAX >> 4))
                return malformed(self, "chunk size too large");
            self->remaining = self->remaining * 16 + digit;
            self->size_digits++;
        } else if (self->size_digits == 0) {
            return malformed(self, "invalid character in chunk size");
        } else if (c == ';') {
            self->state = EXT_START;
        } else if (c == '\r') {
            self->state = CHUNK_SIZE_LF;
        } else {
            return malformed(self, "invalid character in chunk size");
        }
        return 0;
    }
    case EXT_START:
    case EXT_NAME:
    case EXT_VALUE_START:
    case EXT_VALUE:
    case EXT_QUOTED:
    case EXT_QUOTED_PAIR:
    case EXT_QUOTED_END: {
        int next = extension_state(self->state, c);
        if (next < 0)
            return malformed(self, "invalid character in chunk extension");
        self->state = (enum state)next;
        return 0;
    }
    case CHUNK_SIZE_LF:
        if (c != '\n')
            return malformed(self, "expected LF after chunk size");
        self->state = self->remaining ? CHUNK_DATA : TRAILER_START;
        return 0;
    case CHUNK_DATA_CR:
        if (c != '\r')
            return malformed(self, "expected CRLF after chunk data");
        self->state = CHUNK_DATA_LF;
        return 0;
    case CHUNK_DATA_LF:
        if (c != '\n')
            return malformed(self, "expected CRLF after chunk data");
        self->state = CHUNK_SIZE;
        self->size_digits = 0;
        return 0;
    case TRAILER_START:
    case TRAILER_LINE:
    case TRAILER_LINE_LF:
        /* Lines end in CRLF (llhttp takes no bare LF here); llhttp parses them at the end. */
        if ((c == '\n') != (self->state == TRAILER_LINE_LF))
            return malformed(self, "expected CRLF in the trailer");
        if (self->head_len >= HEAD_LIMIT)
            return malformed(self, "trailer larger than 64 KiB");
        if (grow(&self->head, &self->head_cap, self->head_len + 1) < 0)
            return -1;
        self->head[self->head_len++] = c;
        if (c == '\r')
            self->state = self->state == TRAILER_START ? TRAILER_END_LF : TRAILER_LINE_LF;
        else
            self->state = c == '\n' ? TRAILER_START : TRAILER_LINE;
        return 0;
    case TRAILER_END_LF:
        if (c != '\n')
            return malformed(self, "expected LF after the last chunk");
        if (grow(&self->head, &self->head_cap, self->head_len + 1) < 0)
            return -1;
        self->head[self->head_len++] = c;
        return body_complete(self, 1);
    default:
        PyErr_SetString(PyExc_AssertionError, "chunk_byte outside chunked framing");
        return -1;
    }
}

/* One read's bytes through the framing. Returns as take_piece. */
static int feed(Reader *self, const char *data, Py_ssize_t size)
{
    Py_ssize_t at = 0;
    int result = 0;
    while (at < size && result == 0) {
        Py_ssize_t take;
        switch (self->state) {
        case HEAD:
            result = head_bytes(self, data + at, size - at, &take);
            at += take;
            break;
        case CHUNK_DATA:
        case BODY_LENGTH:
            take = size - at < self->remaining ? size - at : (Py_ssize_t)self->remaining;
            result = body_span(self, data + at, take);
            at += take;
            self->remaining -= take;
            if (result == 0 && self->remaining == 0) {
                if (self->state == CHUNK_DATA)
                    self->state = CHUNK_DATA_CR;
                else
                    result = body_complete(self, 0);
            }
            break;
        case BODY_CLOSE:
            result = body_span(self, data + at, size - at);
            at = size;
            break;
        default:
            result = chunk_byte(self, data[at]);
            at++;
        }
    }
    return result;
}

/* The server closed: a read-until-close body ends here (the connection's connection_lost
   completes it with the partial line set here), anything else fails as a reset. */
static int end_of_stream(Reader *self)
{
    if (self->state == BODY_CLOSE) {
        PyObject *line = partial_line(self);
        if (line == NULL)
            return -1;
        int result = PyObject_SetAttr(self->conn, s_line, line);
        Py_DECREF(line);
        if (result < 0)
            return -1;
    }
    PyObject *result = PyObject_CallFunctionObjArgs(self->lost, Py_None, NULL);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

static int socket_error(Reader *self)
{
    PyErr_SetFromErrno(PyExc_OSError);  /* the errno's subclass: ConnectionResetError, ... */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *result = value ? PyObject_CallFunctionObjArgs(self->lost, value, NULL) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* A read failed in a call into Python: raised into the loop's handler the request would carry
   on without this read, so the connection fails it, as Connection.feed does on the Python path.
   Should that raise too, the transport closes the socket (left registered, a level-triggered
   poll would call the reader again and again). Returns 0, or -1 with the last error set. */
static int fail_read(Reader *self)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *done = value ? call_conn(self, s_fail_unexpected, value, NULL) : NULL;
    if (done == NULL) {
        PyObject *lost_type, *lost_value, *lost_traceback;
        PyErr_Fetch(&lost_type, &lost_value, &lost_traceback);
        PyErr_NormalizeException(&lost_type, &lost_value, &lost_traceback);
        PyObject *error = lost_value ? lost_value : value;
        done = error ? PyObject_CallFunctionObjArgs(self->lost, error, NULL) : NULL;
        if (done == NULL)
            PyErr_Restore(lost_type, lost_value, lost_traceback);  /* to the loop's handler */
        else {
            Py_XDECREF(lost_type);
            Py_XDECREF(lost_value);
            Py_XDECREF(lost_traceback);
        }
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* One read of `size` bytes into `buffer`: its stamp, then the framing. Returns as take_piece. */
static int read_into(Reader *self, char *buffer, Py_ssize_t size)
{
    union {  /* aligned for the control message's header */
        struct cmsghdr header;
        char bytes[CMSG_SPACE(2 * sizeof(long long))];
    } ancillary;
    struct iovec vector = {buffer, (size_t)size};
    struct msghdr message = {0};
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    message.msg_control = ancillary.bytes;
    message.msg_controllen = sizeof ancillary.bytes;
    ssize_t got = recvmsg(self->fd, &message, 0);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (got <= 0) {
        self->closed = 1;
        return got < 0 ? socket_error(self) : end_of_stream(self);
    }
    int result = read_stamp(&message, &self->now);
    if (result == 0 && self->state == HEAD)  /* a body's reads come after its head's, which told it */
        result = PyObject_SetAttr(self->conn, s_received, Py_True);
    if (result == 0)
        result = feed(self, buffer, got);
    if (result != 0)
        self->closed = 1;  /* failed, or the connection closed in a call into Python */
    return result;
}

static PyObject *Reader_readable(Reader *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed)
        Py_RETURN_NONE;
    Py_INCREF(self);  /* the loop's handle may go while the connection closes in a call below */
    int result;
    if (!read_buffer_busy) {
        read_buffer_busy = 1;
        result = read_into(self, read_buffer, read_size);
        read_buffer_busy = 0;
    } else {  /* a read is walking the shared buffer (see read_buffer) */
        char *own = malloc((size_t)read_size);
        result = own == NULL ? (PyErr_NoMemory(), -1) : read_into(self, own, read_size);
        free(own);
    }
    if (result < 0 && fail_read(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(self);
    Py_RETURN_NONE;
}

/* The pending pieces as (pieces, stamps, counts) -- counts None unless COUNTED, a counted piece
   None in pieces -- or None when there are none; the Reader keeps none of them after. */
static PyObject *Reader_take_batch(Reader *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t pending = self->pending;
    if (pending == 0)
        Py_RETURN_NONE;
    self->pending = 0;
    PyObject *kept = self->kept, *pieces = NULL, *stamps = NULL, *counts = NULL, *batch = NULL;
    self->kept = NULL;
    stamps = PyList_New(pending);
    if (stamps == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < pending; i++) {
        PyObject *stamp = PyLong_FromLongLong(self->stamps[i]);
        if (stamp == NULL)
            goto done;
        PyList_SetItem(stamps, i, stamp);
    }
    if (self->mode != COUNTED) {  /* every piece kept */
        pieces = kept;
        kept = NULL;
        counts = Py_None;
        Py_INCREF(counts);
    } else {
        pieces = PyList_New(pending);
        counts = PyList_New(pending);
        if (pieces == NULL || counts == NULL)
            goto done;
        Py_ssize_t next_kept = 0;
        for (Py_ssize_t i = 0; i < pending; i++) {
            PyObject *count = PyLong_FromSsize_t(self->counts[i]);
            if (count == NULL)
                goto done;
            PyList_SetItem(counts, i, count);
            PyObject *piece = self->counts[i] ? Py_None : PyList_GetItem(kept, next_kept++);
            if (piece == NULL)
                goto done;
            Py_INCREF(piece);
            PyList_SetItem(pieces, i, piece);
        }
    }
    batch = PyTuple_Pack(3, pieces, stamps, counts);
done:
    Py_XDECREF(kept);
    Py_XDECREF(pieces);
    Py_XDECREF(stamps);
    Py_XDECREF(counts);
    return batch;
}

static Py_ssize_t Reader_length(Reader *self)
{
    return self->pending;
}

static PyObject *Reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"fd", "conn", "lost", NULL};
    int fd;
    PyObject *conn, *lost;
    if (read_buffer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_readpath.configure() first");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOO:Reader", names, &fd, &conn, &lost))
        return NULL;
    Reader *self = (Reader *)PyType_GenericAlloc(type, 0);
    if (self == NULL)
        return NULL;
    self->fd = fd;
    Py_INCREF(conn);
    self->conn = conn;
    Py_INCREF(lost);
    self->lost = lost;
    self->state = HEAD;
    return (PyObject *)self;
}

static int Reader_traverse(Reader *self, visitproc visit, void *arg)
{
    Py_VISIT(self->conn);
    Py_VISIT(self->lost);
    Py_VISIT(self->kept);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int Reader_clear(Reader *self)
{
    Py_CLEAR(self->conn);
    Py_CLEAR(self->lost);
    Py_CLEAR(self->kept);
    return 0;
}

static void Reader_dealloc(Reader *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Reader_clear(self);
    free(self->head);
    free(self->line);
    free(self->stamps);
    free(self->counts);
    freefunc free_slot = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_slot(self);
    Py_DECREF(type);
}

static PyMethodDef Reader_methods[] = {
    {"readable", (PyCFunction)Reader_readable, METH_NOARGS,
     "Read what the socket holds and take it through the framing (the loop's reader callback)."},
    {"take_batch", (PyCFunction)Reader_take_batch, METH_NOARGS,
     "The pieces read and not yet taken, as (pieces, stamps, counts), or None: counts is None unless the "
     "body is COUNTED, where a piece counted as it was read is None in pieces, with its count."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Reader_slots[] = {
    {Py_tp_doc, "Reader(fd, conn, lost): the compiled reads of one plain-http connection."},
    {Py_tp_new, Reader_new},
    {Py_tp_dealloc, Reader_dealloc},
    {Py_tp_traverse, Reader_traverse},
    {Py_tp_clear, Reader_clear},
    {Py_tp_methods, Reader_methods},
    {Py_sq_length, Reader_length},  /* the pieces not yet taken */
    {0, NULL},
};

static PyType_Spec Reader_spec = {
    "loadgen.transport._readpath.Reader", sizeof(Reader), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Reader_slots,
};

static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *source;
    long long refresh;
    Py_ssize_t size, batch;
    if (!PyArg_ParseTuple(args, "OLnn:configure", &source, &refresh, &size, &batch))
        return NULL;
    if (size <= 0 || batch <= 0) {
        PyErr_SetString(PyExc_ValueError, "configure: read size and batch must be positive");
        return NULL;
    }
    if (read_buffer_busy) {
        PyErr_SetString(PyExc_RuntimeError, "configure: called while a read is under way");
        return NULL;
    }
    char *buffer = realloc(read_buffer, (size_t)size);
    if (buffer == NULL)
        return PyErr_NoMemory();
    read_buffer = buffer;
    read_size = size;
    Py_INCREF(source);
    Py_XDECREF(offset_source);
    offset_source = source;
    refresh_ns = refresh;
    offset_valid_until = 0;
    batch_pieces = batch;
    Py_RETURN_NONE;
}

/* -- The token counts of a batch of SSE content events (http._SseStream's fast path) ---------

   count_content_tokens answers piece by piece: the token count of a piece that is one event
   `data: {...}\n\n` of the shape the Python path counts as content chunks -- an object with
   no "error" key, no "usage" but a null one (vLLM's and our server's chunks under include_usage
   carry `"usage":null`; the Python path counts those too), whose "choices" list opens with an
   object whose "token_ids" is a non-empty list of integers.
   It validates the JSON grammar of everything it takes, string values included (JSON's escapes
   and UTF-8 text, as orjson accepts them: detokenised text is full of both), and anything else --
   a key with an escape or a non-ASCII byte, a \u escape of a lone surrogate, a key given twice
   where it counts (orjson keeps the last), numbers that might not be finite as doubles, deep
   nesting -- makes it answer 0 for that piece (a content chunk has at least one token), so
   orjson parses that piece as on the Python path and malformed JSON fails its request there.
   One usage event, chat role chunk or [DONE] thus costs its own parse, not its batch's. */

#define JSON_DEPTH_LIMIT 64       /* orjson's is deeper: past this the piece goes to orjson */
#define JSON_INTEGER_DIGITS 100   /* with at most 2 exponent digits a number stays finite */
#define JSON_EXPONENT_DIGITS 2

typedef struct {
    const char *at, *end;
    int depth;
} Json;

/* How an object's keys count: any object, an event, or an event's first choice. */
enum json_object_kind { ANY_OBJECT, EVENT_OBJECT, CHOICE_OBJECT };

static int json_value(Json *j);

/* The scans below walk a local pointer: j->at, stored through a char pointer, would be
   reloaded at every byte (a char may alias it). */
static void json_space(Json *j)
{
    const char *at = j->at;
    while (at < j->end && (*at == ' ' || *at == '\t' || *at == '\r' || *at == '\n'))
        at++;
    j->at = at;
}

/* Takes `c` after any whitespace; 1 when it was there. */
static int json_take(Json *j, char c)
{
    json_space(j);
    if (j->at < j->end && *j->at == c) {
        j->at++;
        return 1;
    }
    return 0;
}

/* The first byte from `at` that is not plain text: not printable ASCII, or '"' or '\\'. Eight
   bytes at a time while none of them can be one (SWAR: a byte below 0x20, at or above 0x80, '"'
   or '\\' sets its word's flag; one may be a false alarm, which the bytes loop sorts out). */
static const char *plain_text_end(const char *at, const char *end)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    for (uint64_t word; end - at >= 8; at += 8) {
        memcpy(&word, at, 8);
        uint64_t quote = word ^ (ones * '"'), backslash = word ^ (ones * '\\');
        uint64_t stop = (word - ones * 0x20) | word | ((quote - ones) & ~quote)
            | ((backslash - ones) & ~backslash);
        if (stop & highs)
            break;
    }
    for (; at < end; at++) {
        unsigned char c = (unsigned char)*at;
        if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\')
            break;
    }
    return at;
}

/* The four hex digits of a \u escape at `at`, or -1. */
static long json_hex4(const char *at, const char *end)
{
    if (end - at < 4)
        return -1;
    long value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_value(at[i]);
        if (digit < 0)
            return -1;
        value = value * 16 + digit;
    }
    return value;
}

/* Past one escape whose backslash is at `at`, or NULL when JSON does not allow it. A \u escape of
   a UTF-16 surrogate counts only as the high half of a pair followed by its low half (orjson
   rejects a lone one; here it sends the piece to orjson either way). */
static const char *json_escape(const char *at, const char *end)
{
    if (end - at < 2)
        return NULL;
    switch (at[1]) {
    case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
        return at + 2;
    case 'u': {
        long unit = json_hex4(at + 2, end);
        if (unit < 0xD800 || unit > 0xDFFF)
            return unit < 0 ? NULL : at + 6;
        if (unit >= 0xDC00 || end - at < 12 || at[6] != '\\' || at[7] != 'u')
            return NULL;
        long low = json_hex4(at + 8, end);
        return low >= 0xDC00 && low <= 0xDFFF ? at + 12 : NULL;
    }
    default:
        return NULL;
    }
}

/* Past one UTF-8 character of two to four bytes whose lead byte is at `at`, or NULL when the
   bytes are not one (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static const char *json_utf8(const char *at, const char *end)
{
    unsigned char lead = (unsigned char)at[0];
    int size;
    unsigned char low = 0x80, high = 0xBF;  /* the second byte's range */
    if (lead >= 0xC2 && lead <= 0xDF)
        size = 2;
    else if (lead >= 0xE0 && lead <= 0xEF)
        size = 3;
    else if (lead >= 0xF0 && lead <= 0xF4)
        size = 4;
    else
        return NULL;
    if (lead == 0xE0)
        low = 0xA0;   /* below: overlong */
    else if (lead == 0xED)
        high = 0x9F;  /* above: a surrogate */
    else if (lead == 0xF0)
        low = 0x90;   /* below: overlong */
    else if (lead == 0xF4)
        high = 0x8F;  /* above: past U+10FFFF */
    if (end - at < size)
        return NULL;
    unsigned char second = (unsigned char)at[1];
    if (second < low || second > high)
        return NULL;
    for (int i = 2; i < size; i++)
        if (((unsigned char)at[i] & 0xC0) != 0x80)
            return NULL;
    return at + size;
}

/* A string value: JSON's escapes and UTF-8 text, validated as orjson does. 0, or -1. */
static int json_string(Json *j)
{
    if (!json_take(j, '"'))
        return -1;
    const char *at = j->at, *end = j->end;
    for (;;) {
        at = plain_text_end(at, end);
        if (at == end)
            return -1;
        unsigned char c = (unsigned char)*at;
        if (c == '"') {
            j->at = at + 1;
            return 0;
        }
        if (c == '\\')
            at = json_escape(at, end);
        else if (c >= 0x80)
            at = json_utf8(at, end);
        else
            return -1;  /* a control character */
        if (at == NULL)
            return -1;
    }
}

/* A key: plain text only, so that its bytes are its name (an escaped or non-ASCII key could
   spell "choices" or "usage"; those pieces go to orjson). 0, or -1. */
static int json_key(Json *j, const char **text, Py_ssize_t *size)
{
    if (!json_take(j, '"'))
        return -1;
    const char *start = j->at, *at = plain_text_end(start, j->end);
    if (at == j->end || *at != '"')
        return -1;
    *text = start;
    *size = at - start;
    j->at = at + 1;
    return 0;
}

static Py_ssize_t json_digits(Json *j)
{
    const char *start = j->at, *at = start;
    while (at < j->end && *at >= '0' && *at <= '9')
        at++;
    j->at = at;
    return at - start;
}

/* A number (an integer when `integer_only`); what follows it is the caller's to check. */
static int json_number(Json *j, int integer_only)
{
    json_space(j);
    if (j->at < j->end && *j->at == '-')
        j->at++;
    if (j->at < j->end && *j->at == '0') {
        j->at++;
    } else {
        Py_ssize_t digits = json_digits(j);
        if (digits == 0 || digits > JSON_INTEGER_DIGITS)
            return -1;
    }
    if (j->at < j->end && *j->at == '.') {
        j->at++;
        if (integer_only || json_digits(j) == 0)
            return -1;
    }
    if (j->at < j->end && (*j->at == 'e' || *j->at == 'E')) {
        j->at++;
        if (j->at < j->end && (*j->at == '+' || *j->at == '-'))
            j->at++;
        Py_ssize_t digits = json_digits(j);
        if (integer_only || digits == 0 || digits > JSON_EXPONENT_DIGITS)
            return -1;
    }
    return 0;
}

static int json_literal(Json *j, const char *word)
{
    size_t size = strlen(word);
    if ((size_t)(j->end - j->at) < size || memcmp(j->at, word, size) != 0)
        return -1;
    j->at += size;
    return 0;
}

static int json_nest(Json *j)
{
    return ++j->depth > JSON_DEPTH_LIMIT ? -1 : 0;
}

/* An array's values after its '['. */
static int json_array(Json *j)
{
    if (json_nest(j) < 0)
        return -1;
    if (!json_take(j, ']')) {
        do {
            if (json_value(j) < 0)
                return -1;
        } while (json_take(j, ','));
        if (!json_take(j, ']'))
            return -1;
    }
    j->depth--;
    return 0;
}

/* token_ids: a non-empty list of integers; *tokens its length. */
static int json_token_ids(Json *j, Py_ssize_t *tokens)
{
    Py_ssize_t count = 0;
    if (!json_take(j, '[') || json_nest(j) < 0)
        return -1;
    do {
        if (json_number(j, 1) < 0)
            return -1;
        count++;
    } while (json_take(j, ','));
    if (!json_take(j, ']'))
        return -1;
    j->depth--;
    *tokens = count;
    return 0;
}

static int json_object(Json *j, enum json_object_kind kind, Py_ssize_t *tokens);

/* choices: a list whose first value is an object with token ids; *tokens their count. */
static int json_choices(Json *j, Py_ssize_t *tokens)
{
    if (!json_take(j, '[') || json_nest(j) < 0 || !json_take(j, '{'))
        return -1;
    if (json_object(j, CHOICE_OBJECT, tokens) < 0)
        return -1;
    while (json_take(j, ','))
        if (json_value(j) < 0)
            return -1;
    if (!json_take(j, ']'))
        return -1;
    j->depth--;
    return 0;
}

static int json_key_is(const char *key, Py_ssize_t size, const char *name)
{
    return (size_t)size == strlen(name) && memcmp(key, name, (size_t)size) == 0;
}

/* An object's members after its '{'. An event's or a choice's sets *tokens (> 0) from its
   choices or token ids, and fails without them. */
static int json_object(Json *j, enum json_object_kind kind, Py_ssize_t *tokens)
{
    if (json_nest(j) < 0)
        return -1;
    *tokens = 0;
    int usage_seen = 0;
    if (!json_take(j, '}')) {
        do {
            const char *key;
            Py_ssize_t size;
            if (json_key(j, &key, &size) < 0 || !json_take(j, ':'))
                return -1;
            int result;
            if (kind == EVENT_OBJECT && json_key_is(key, size, "choices"))
                result = *tokens ? -1 : json_choices(j, tokens);
            else if (kind == CHOICE_OBJECT && json_key_is(key, size, "token_ids"))
                result = *tokens ? -1 : json_token_ids(j, tokens);
            else if (kind == EVENT_OBJECT && json_key_is(key, size, "usage"))  /* null: as vLLM's chunks */
                result = usage_seen++ ? -1 : (json_space(j), json_literal(j, "null"));
            else if (kind == EVENT_OBJECT && json_key_is(key, size, "error"))
                result = -1;
            else
                result = json_value(j);
            if (result < 0)
                return -1;
        } while (json_take(j, ','));
        if (!json_take(j, '}'))
            return -1;
    }
    j->depth--;
    return kind == ANY_OBJECT || *tokens > 0 ? 0 : -1;
}

static int json_value(Json *j)
{
    Py_ssize_t unused;
    json_space(j);
    if (j->at >= j->end)
        return -1;
    switch (*j->at) {
    case '{':
        j->at++;
        return json_object(j, ANY_OBJECT, &unused);
    case '[':
        j->at++;
        return json_array(j);
    case '"':
        return json_string(j);
    case 't':
        return json_literal(j, "true");
    case 'f':
        return json_literal(j, "false");
    case 'n':
        return json_literal(j, "null");
    default:
        return json_number(j, 0);
    }
}

/* The token count of one piece holding one content event, or 0 when it is anything else. */
static Py_ssize_t event_tokens(const char *data, Py_ssize_t size)
{
    if (size < 7 || memcmp(data, "data:", 5) != 0 || data[size - 2] != '\n' || data[size - 1] != '\n'
            || memchr(data, '\n', (size_t)(size - 2)) != NULL)
        return 0;  /* not one `data:` line and its blank line */
    Json j = {data + 5, data + size - 2, 0};
    Py_ssize_t tokens;
    if (!json_take(&j, '{') || json_object(&j, EVENT_OBJECT, &tokens) < 0)
        return 0;
    json_space(&j);
    return j.at == j.end ? tokens : 0;
}

static PyObject *count_content_tokens(PyObject *Py_UNUSED(module), PyObject *pieces)
{
    if (!PyList_Check(pieces)) {
        PyErr_SetString(PyExc_TypeError, "count_content_tokens: pieces must be a list of bytes");
        return NULL;
    }
    Py_ssize_t count = PyList_Size(pieces);
    PyObject *counts = PyList_New(count);
    if (counts == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        char *data;
        Py_ssize_t size;
        if (PyBytes_AsStringAndSize(PyList_GetItem(pieces, i), &data, &size) < 0) {
            Py_DECREF(counts);
            return NULL;
        }
        PyObject *number = PyLong_FromSsize_t(event_tokens(data, size));
        if (number == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SetItem(counts, i, number);
    }
    return counts;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(offset, refresh_ns, read_size, batch_pieces): the clock offset's source and how "
     "long an offset holds, the bytes asked of each read, the pieces kept before a batch goes out."},
    {"count_content_tokens", count_content_tokens, METH_O,
     "count_content_tokens(pieces): for each piece, the token ids' count of its SSE event when it is one "
     "plain content chunk with token ids (http._SseStream's fast path), else 0 (orjson parses it)."},
    {NULL, NULL, 0, NULL},
};

static int intern_names(void)
{
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_received, "_received"},
        {&s_closed, "closed"}, {&s_line, "_line"}, {&s_deliver, "deliver"},
        {&s_take_head, "take_head"}, {&s_finish_body, "finish_body"}, {&s_on_body, "on_body"},
        {&s_malformed_body, "malformed_body"}, {&s_fail_unexpected, "_fail_unexpected"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL)
            return -1;
    }
    return 0;
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_readpath",
    "The compiled read path of plain-http connections (see loadgen/transport/readpath.py).",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__readpath(void)
{
    if (intern_names() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddIntConstant(module, "READ_PATH_VERSION", READ_PATH_VERSION) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    PyObject *type = PyType_FromSpec(&Reader_spec);
    if (type == NULL || PyModule_AddObject(module, "Reader", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

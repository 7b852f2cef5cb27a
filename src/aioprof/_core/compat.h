/* compat.h - every PY_VERSION_HEX check of aioprof lives here (CPython 3.10 to 3.13).
 *
 * Only public C API is used. Where an API appeared in a later version, the older
 * versions get an equivalent built from older public calls. */
#ifndef AP_COMPAT_H
#define AP_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>

/* Exception save/restore around work done while an exception may be in flight
 * (e.g. a KeyboardInterrupt leaving a step). 3.12 replaced the (type, value, tb)
 * triple with a single exception object. */
#if PY_VERSION_HEX >= 0x030C0000
typedef struct { PyObject *exc; } ap_exc_state_t;
static inline void ap_exc_save(ap_exc_state_t *s) { s->exc = PyErr_GetRaisedException(); }
static inline void ap_exc_restore(ap_exc_state_t *s) { PyErr_SetRaisedException(s->exc); }
/* The exception object of a saved state (borrowed), or NULL. */
static inline PyObject *ap_exc_value(ap_exc_state_t *s) { return s->exc; }
/* Drop a saved exception without raising it. */
static inline void ap_exc_drop(ap_exc_state_t *s) { Py_CLEAR(s->exc); }
#else
typedef struct { PyObject *type, *value, *tb; } ap_exc_state_t;
static inline void ap_exc_save(ap_exc_state_t *s) { PyErr_Fetch(&s->type, &s->value, &s->tb); }
static inline void ap_exc_restore(ap_exc_state_t *s) { PyErr_Restore(s->type, s->value, s->tb); }
static inline PyObject *ap_exc_value(ap_exc_state_t *s)
{
    PyErr_NormalizeException(&s->type, &s->value, &s->tb);
    return s->value;
}
static inline void ap_exc_drop(ap_exc_state_t *s)
{
    Py_CLEAR(s->type);
    Py_CLEAR(s->value);
    Py_CLEAR(s->tb);
}
#endif

/* Thread-locals read on every step: the initial-exec model makes a read one instruction
 * instead of a __tls_get_addr call (a few words of the static TLS surplus that glibc
 * keeps for dlopen'ed modules). */
#if defined(__GNUC__) && defined(__linux__)
#define AP_TLS _Thread_local __attribute__((tls_model("initial-exec")))
#else
#define AP_TLS _Thread_local
#endif

/* Py_NewRef / Py_XNewRef: 3.10 has them; kept here should the floor move down. */

/* The qualified name of a code object: co_qualname exists from 3.11; before that
 * co_name is the best the code object itself knows. Returns a new reference. */
static inline PyObject *ap_code_qualname(PyCodeObject *code)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyObject_GetAttrString((PyObject *)code, "co_qualname");
#else
    return PyObject_GetAttrString((PyObject *)code, "co_name");
#endif
}

/* The object a weak reference points to, as a new reference, or NULL when it is dead
 * (never an error: one is cleared). 3.13 deprecated PyWeakref_GetObject. */
static inline PyObject *ap_weakref_get(PyObject *wr)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj = NULL;
    if (PyWeakref_GetRef(wr, &obj) < 0)
        PyErr_Clear();
    return obj;
#else
    PyObject *obj = PyWeakref_GetObject(wr);
    if (!obj) {
        PyErr_Clear();
        return NULL;
    }
    return obj == Py_None ? NULL : Py_NewRef(obj);
#endif
}

/* Whether code objects know their qualified name (co_qualname, 3.11+). Before that,
 * the qualified name of a coroutine comes from the coroutine object itself. */
#define AP_CODE_HAS_QUALNAME (PY_VERSION_HEX >= 0x030B0000)

/* Dict watchers (PyDict_AddWatcher), 3.12+: how eager task starts are seen (tasks.c).
 * 3.12 is also where eager tasks appeared. */
#define AP_HAVE_DICT_WATCH (PY_VERSION_HEX >= 0x030C0000)
/* 3.14+ keeps the running task in the thread state, not in a dict: eager starts are seen
 * by a context watcher (PyContext_AddWatcher, Py_CONTEXT_SWITCHED) instead. */
#define AP_HAVE_CONTEXT_SWITCH_WATCH (PY_VERSION_HEX >= 0x030E0000)

/* The index of a frame's last instruction: public API from 3.11, a struct field before. */
static inline int ap_frame_lasti(PyFrameObject *f)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(f);
#else
    return f->f_lasti;
#endif
}

/* PyEval_GetFrame returns a borrowed reference on every supported version. */
static inline PyFrameObject *ap_current_frame(void) { return PyEval_GetFrame(); }

/* Fast reads of attributes on the hot path, through the descriptors' public structs
 * (Include/cpython/descrobject.h) instead of a full attribute lookup per step. */

/* A __slots__ member of a class: its offset is the same in every subclass. */
typedef struct { Py_ssize_t offset; } ap_slot_t;

/* Find cls.<name>'s member descriptor; 0, or -1 with an exception set. */
static inline int ap_slot_init(ap_slot_t *slot, PyObject *cls, const char *name)
{
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (!d)
        return -1;
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok)
        slot->offset = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s is not a __slots__ member", name);
        return -1;
    }
    return 0;
}

/* The slot's value (borrowed), NULL when unset. obj must be an instance of the class. */
static inline PyObject *ap_slot_get(const ap_slot_t *slot, PyObject *obj)
{
    return *(PyObject **)((char *)obj + slot->offset);
}

/* The C getter behind a type's getset attribute (e.g. TaskStepMethWrapper.__self__),
 * or NULL (no exception) when the attribute is something else. */
static inline PyGetSetDef *ap_getset_of(PyTypeObject *tp, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)tp, name);
    if (!d) {
        PyErr_Clear();
        return NULL;
    }
    PyGetSetDef *gs = Py_IS_TYPE(d, &PyGetSetDescr_Type) ? ((PyGetSetDescrObject *)d)->d_getset : NULL;
    Py_DECREF(d);
    return gs && gs->get ? gs : NULL;
}

#endif /* AP_COMPAT_H */

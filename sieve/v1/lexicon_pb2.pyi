import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImportMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMPORT_MODE_UNSPECIFIED: _ClassVar[ImportMode]
    IMPORT_MODE_MERGE: _ClassVar[ImportMode]
    IMPORT_MODE_REPLACE: _ClassVar[ImportMode]
IMPORT_MODE_UNSPECIFIED: ImportMode
IMPORT_MODE_MERGE: ImportMode
IMPORT_MODE_REPLACE: ImportMode

class LexiconWord(_message.Message):
    __slots__ = ("word", "category", "severity", "updated_at")
    WORD_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    word: str
    category: str
    severity: int
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, word: _Optional[str] = ..., category: _Optional[str] = ..., severity: _Optional[int] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListLexiconRequest(_message.Message):
    __slots__ = ("category", "word_prefix", "page_size", "page_token")
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    WORD_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    category: str
    word_prefix: str
    page_size: int
    page_token: str
    def __init__(self, category: _Optional[str] = ..., word_prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLexiconResponse(_message.Message):
    __slots__ = ("words", "next_page_token", "version", "total")
    WORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    words: _containers.RepeatedCompositeFieldContainer[LexiconWord]
    next_page_token: str
    version: int
    total: int
    def __init__(self, words: _Optional[_Iterable[_Union[LexiconWord, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., version: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class AddWordsRequest(_message.Message):
    __slots__ = ("words",)
    WORDS_FIELD_NUMBER: _ClassVar[int]
    words: _containers.RepeatedCompositeFieldContainer[LexiconWord]
    def __init__(self, words: _Optional[_Iterable[_Union[LexiconWord, _Mapping]]] = ...) -> None: ...

class AddWordsResponse(_message.Message):
    __slots__ = ("version", "added", "updated")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    version: int
    added: int
    updated: int
    def __init__(self, version: _Optional[int] = ..., added: _Optional[int] = ..., updated: _Optional[int] = ...) -> None: ...

class RemoveWordsRequest(_message.Message):
    __slots__ = ("words",)
    WORDS_FIELD_NUMBER: _ClassVar[int]
    words: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, words: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveWordsResponse(_message.Message):
    __slots__ = ("version", "removed", "not_found")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    NOT_FOUND_FIELD_NUMBER: _ClassVar[int]
    version: int
    removed: int
    not_found: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., removed: _Optional[int] = ..., not_found: _Optional[_Iterable[str]] = ...) -> None: ...

class ImportLexiconRequest(_message.Message):
    __slots__ = ("words", "mode")
    WORDS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    words: _containers.RepeatedCompositeFieldContainer[LexiconWord]
    mode: ImportMode
    def __init__(self, words: _Optional[_Iterable[_Union[LexiconWord, _Mapping]]] = ..., mode: _Optional[_Union[ImportMode, str]] = ...) -> None: ...

class ImportLexiconResponse(_message.Message):
    __slots__ = ("version", "added", "updated", "removed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    version: int
    added: int
    updated: int
    removed: int
    def __init__(self, version: _Optional[int] = ..., added: _Optional[int] = ..., updated: _Optional[int] = ..., removed: _Optional[int] = ...) -> None: ...

class ExportLexiconRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExportLexiconResponse(_message.Message):
    __slots__ = ("words", "version")
    WORDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    words: _containers.RepeatedCompositeFieldContainer[LexiconWord]
    version: int
    def __init__(self, words: _Optional[_Iterable[_Union[LexiconWord, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...
